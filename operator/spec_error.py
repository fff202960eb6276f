"""The one error a RimuruDeployment spec that can never work raises (spec.py and the
modules that parse a part of it)."""

from __future__ import annotations


class SpecError(ValueError):
    """The spec can never work as written; `field` is its dotted path."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
