"""Adjuster tunables: data, validated on construction, pushed live by the control plane."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

MODES = ("resident", "fixed", "elastic")


def parse_modes(text: str) -> tuple[str, ...]:
    """A comma list of memory policies (the --policies flag of `rimuru bench` and `plan`)."""
    modes = tuple(m.strip() for m in text.split(",") if m.strip())
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise ValueError(f"unknown policy {unknown}: choose from {', '.join(MODES)}")
    return modes


@dataclass(frozen=True)
class Tunables:
    mode: str = "elastic"
    expert_offload_limit: int = 8  # at most this many experts per layer off the device
    shrink_threshold: int = 2  # nothing short but fewer free expert pages than this -> evict 1
    grow_threshold: int = 9  # more free expert pages than this -> bring experts back
    max_grow_per_round: int = 5
    pages_per_expert: int = 3  # w1, w3, w2
    # Elastic: the expert copies per decode step that the experts the adjuster offloaded
    # may cost: the larger of what the ranking's routing probabilities expect at the batch
    # and what the steps measurably copy; it stops evictions and caps admission
    # (adjuster.py, engine/copy_budget.py). Experts offloaded at start-up are outside it.
    # 0 = no budget: offload up to expert_offload_limit whatever the copies cost.
    copy_budget: float = 0.0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}; got {self.mode!r}")
        for name, low in (
            ("expert_offload_limit", 0),
            ("shrink_threshold", 0),
            ("grow_threshold", 0),
            ("max_grow_per_round", 0),
            ("pages_per_expert", 1),
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}; got {value!r}")
        if (
            not isinstance(self.copy_budget, int | float)
            or isinstance(self.copy_budget, bool)
            or not math.isfinite(self.copy_budget)
            or self.copy_budget < 0
        ):
            raise ValueError(f"copy_budget must be a finite number >= 0; got {self.copy_budget!r}")
        if self.copy_budget and self.mode != "elastic":
            raise ValueError(
                f"copy_budget applies only to mode elastic (its evictions and admission); set it "
                f"to 0 for mode {self.mode}"
            )
        if self.grow_threshold < self.shrink_threshold:
            raise ValueError(
                f"grow_threshold ({self.grow_threshold}) must be >= shrink_threshold "
                f"({self.shrink_threshold}), otherwise the adjuster would grow and shrink "
                f"in the same state"
            )

    def to_dict(self) -> dict:
        return asdict(self)
