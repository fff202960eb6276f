"""The adjuster's tunables: data, validated on construction, pushed live by the control plane.

An invalid Tunables never exists, on either plane: the rules here are the ones the wire
contract (rimuru.v1.Tunables, int32 fields) and the adjuster both need.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from rimuru.policy.errors import InvalidPolicy


@dataclass(frozen=True)
class ModeFacts:
    """What the tunables' own rules must know of a memory policy. The policy's behaviour is
    the data plane's object for it (dataplane/policies/), which this leaf cannot import; a
    test keeps the facts here agreeing with those objects."""

    offloads: bool  # experts may live on the host: expert_offload_limit means something
    moves_boundary: bool  # the adjuster moves experts while serving: copy_budget applies
    # The elastic rules under which evictions are priced by their copies: tpot_slo_ms applies.
    priced_rules: tuple[str, ...] = ()


# The one table of memory-policy names on this side of the planes: ask it, never compare a
# name. How elastic decides to evict: "cost" prices each eviction against the copies it adds
# (dataplane/adjust/payoff.py); "paper" evicts whenever pages run short, as the Rimuru paper
# does (kept for the ablation).
_MODE_FACTS = {
    "resident": ModeFacts(offloads=False, moves_boundary=False),
    "fixed": ModeFacts(offloads=True, moves_boundary=False),
    "elastic": ModeFacts(offloads=True, moves_boundary=True, priced_rules=("cost",)),
}
MODES = tuple(_MODE_FACTS)
ELASTIC_RULES = ("cost", "paper")
INT32_MAX = 2**31 - 1
# w1, w3, w2: an expert takes one pool page for each of its matrices. Once a tunable: the
# wire (Tunables field 6), the flags and the CRD still take this one value from old clients
# (`check_pages_per_expert`) and refuse any other.
EXPERT_MATRICES = 3


def mode_facts(mode: str) -> ModeFacts:
    """The facts of a mode Tunables has checked (KeyError for any other name)."""
    return _MODE_FACTS[mode]


def check_pages_per_expert(value: object) -> None:
    """The retired pages_per_expert as an old client gives it: EXPERT_MATRICES, or refused
    (the caller skips the check where the field is unset)."""
    if not isinstance(value, int) or isinstance(value, bool) or value != EXPERT_MATRICES:
        raise InvalidPolicy(
            "tunables.pages_per_expert",
            f"must be {EXPERT_MATRICES} (an expert takes one page for each of w1, w3, w2), "
            f"or left out; got {value!r}",
        )


def parse_modes(text: str) -> tuple[str, ...]:
    """A comma list of memory policies (the --policies flag of `rimuru bench` and `plan`)."""
    modes = tuple(m.strip() for m in text.split(",") if m.strip())
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise ValueError(f"unknown policy {unknown}: choose from {', '.join(MODES)}")
    return modes


def _check_int(name: str, value: object, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidPolicy(f"tunables.{name}", f"must be an integer; got {value!r}")
    if not low <= value <= INT32_MAX:
        raise InvalidPolicy(f"tunables.{name}", f"must be in [{low}, {INT32_MAX}]; got {value}")


def _check_float(name: str, value: object) -> None:
    """A finite number >= 0 (ints allowed, bools not)."""
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not math.isfinite(value)
        or value < 0
    ):
        raise InvalidPolicy(f"tunables.{name}", f"must be a finite number >= 0; got {value!r}")


@dataclass(frozen=True)
class Tunables:
    mode: str = "elastic"
    expert_offload_limit: int = 8  # at most this many experts per layer off the device
    shrink_threshold: int = 2  # nothing short but fewer free expert pages than this -> evict 1
    grow_threshold: int = 9  # more free expert pages than this -> bring experts back
    max_grow_per_round: int = 5
    # The control plane may replace the ranking from the replicas' routing reports; the
    # data plane only carries it.
    online_hotness: bool = False
    # Elastic: the expert copies per decode step that the experts the adjuster offloaded
    # may cost: the larger of what the ranking's routing probabilities expect at the batch
    # and what the steps measurably copy; it stops evictions and caps admission
    # (adjust/adjuster.py, engine/experts/copy_budget.py). Experts offloaded at start-up are
    # outside it. 0 = no budget: offload up to expert_offload_limit whatever it costs.
    copy_budget: float = 0.0
    elastic_rule: str = "cost"
    # Elastic: a decode step may take at most this long (ms) by the cost rule's estimate;
    # evictions that would pass it are refused. 0 = no SLO.
    tpot_slo_ms: float = 0.0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise InvalidPolicy(
                "tunables.mode", f"must be one of {', '.join(MODES)}; got {self.mode!r}"
            )
        _check_int("expert_offload_limit", self.expert_offload_limit, 0)
        _check_int("shrink_threshold", self.shrink_threshold, 0)
        _check_int("grow_threshold", self.grow_threshold, 1)
        _check_int("max_grow_per_round", self.max_grow_per_round, 1)
        if not isinstance(self.online_hotness, bool):
            raise InvalidPolicy("tunables.online_hotness", "must be true or false")
        _check_float("copy_budget", self.copy_budget)
        if self.elastic_rule not in ELASTIC_RULES:
            raise InvalidPolicy(
                "tunables.elastic_rule",
                f"must be one of {', '.join(ELASTIC_RULES)}; got {self.elastic_rule!r}",
            )
        _check_float("tpot_slo_ms", self.tpot_slo_ms)
        facts = _MODE_FACTS[self.mode]
        if self.tpot_slo_ms and self.elastic_rule not in facts.priced_rules:
            raise InvalidPolicy(
                "tunables.tpot_slo_ms",
                "applies only to mode elastic with elastic_rule cost; set it to 0 otherwise",
            )
        if self.copy_budget and not facts.moves_boundary:
            raise InvalidPolicy(
                "tunables.copy_budget",
                "applies only to mode elastic (its evictions and admission); "
                f"set it to 0 for mode {self.mode}",
            )
        # A gap between the thresholds keeps one free-page count from both shrinking and
        # growing the pool round after round.
        if self.grow_threshold <= self.shrink_threshold:
            raise InvalidPolicy(
                "tunables.grow_threshold",
                f"must exceed shrink_threshold ({self.shrink_threshold}); got "
                f"{self.grow_threshold}",
            )

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Tunables:
        """Tunables from `to_dict`'s form, also as older versions wrote it (a stored policy
        may still carry pages_per_expert, which must be EXPERT_MATRICES)."""
        fields = dict(data)
        if "pages_per_expert" in fields:
            check_pages_per_expert(fields.pop("pages_per_expert"))
        return cls(**fields)


def check_pushable(tunables: Tunables) -> Tunables:
    """The control plane's extra rule for a policy it stores and pushes: a mode that
    offloads nothing (resident) makes a limit there only mislead whoever reads the policy.
    (The data plane ignores the limit there: its flags' default 8 is fine.)"""
    if not _MODE_FACTS[tunables.mode].offloads and tunables.expert_offload_limit != 0:
        raise InvalidPolicy(
            "tunables.expert_offload_limit",
            f"must be 0 in mode {tunables.mode} (all experts stay in the pool); "
            f"got {tunables.expert_offload_limit}",
        )
    return tunables
