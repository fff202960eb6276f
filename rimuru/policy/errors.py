"""The one error of the policy vocabulary: a field out of range or inconsistent."""

from __future__ import annotations


class InvalidPolicy(ValueError):
    """`field` names the bad value as the proto spells it (dotted path, e.g.
    `tunables.grow_threshold`, `layers[3].probabilities`), so each plane can say where
    the user fixes it; the control plane answers INVALID_ARGUMENT with it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
