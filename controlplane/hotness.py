"""Online hotness: routing counts from every replica, decayed, ranked, pushed on drift.

The offline ranking is measured once on sample prompts and cannot follow a change of
traffic. Replicas report how many tokens each layer routed to each expert since their
previous report; the aggregator keeps per-deployment counts that halve every
`half_life_s`, so a ranking computed from them follows the traffic of the last few
half-lives. A new ranking is proposed only when it differs enough from the one in force
(total-variation distance of some layer's routing distribution above `drift_threshold`)
and only after every layer has seen `min_tokens_per_layer` (decayed) tokens, at most once
per `min_interval_s` per deployment, so noise does not churn policy versions.

    counts[d][l][e]  decayed tokens routed to expert e of layer l in deployment d
    TV(p, q) = 1/2 * sum_e |p(e) - q(e)|   per layer, then the maximum over layers
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rimuru.controlplane.errors import InvalidArgument
from rimuru.policy import HotnessRanking

MAX_LAYERS = 4096
MAX_EXPERTS = 65536


@dataclass(frozen=True)
class HotnessConfig:
    half_life_s: float = 300.0
    drift_threshold: float = 0.1
    min_tokens_per_layer: float = 256.0
    min_interval_s: float = 30.0

    def __post_init__(self) -> None:
        if not self.half_life_s > 0:
            raise ValueError(f"half_life_s must be > 0; got {self.half_life_s}")
        if not 0 < self.drift_threshold <= 1:
            raise ValueError(f"drift_threshold must be in (0, 1]; got {self.drift_threshold}")
        if not self.min_tokens_per_layer >= 0:
            raise ValueError(f"min_tokens_per_layer must be >= 0; got {self.min_tokens_per_layer}")
        if not self.min_interval_s >= 0:
            raise ValueError(f"min_interval_s must be >= 0; got {self.min_interval_s}")


@dataclass
class _Counts:
    counts: list[list[float]]  # [L][E]
    updated_at: float
    last_proposed_at: float = -math.inf


def check_report(layers: Mapping[int, Sequence[int]]) -> list[list[int]]:
    """A report as a dense [L][E] table: layers 0..L-1 once each, same E everywhere."""
    if not layers:
        raise InvalidArgument("layers", "a routing report needs at least one layer")
    num_layers = len(layers)
    if sorted(layers) != list(range(num_layers)) or num_layers > MAX_LAYERS:
        raise InvalidArgument(
            "layers.layer", f"layers must be 0..{num_layers - 1} (at most {MAX_LAYERS}), once each"
        )
    num_experts = len(layers[0])
    if not 0 < num_experts <= MAX_EXPERTS or any(len(c) != num_experts for c in layers.values()):
        raise InvalidArgument(
            "layers.counts", f"every layer needs the same number (1..{MAX_EXPERTS}) of counts"
        )
    return [list(layers[layer]) for layer in range(num_layers)]


class HotnessAggregator:
    def __init__(self, config: HotnessConfig = HotnessConfig()) -> None:
        self.config = config
        self._by_deployment: dict[str, _Counts] = {}

    def add(self, deployment: str, layers: Mapping[int, Sequence[int]], now: float) -> None:
        """Fold one replica's report in. A report of another shape than the deployment's
        counts so far (a different model) starts the counts afresh."""
        table = check_report(layers)
        state = self._by_deployment.get(deployment)
        if state is None or _shape(state.counts) != _shape(table):
            self._by_deployment[deployment] = _Counts(
                [[float(c) for c in row] for row in table], now
            )
            return
        self._decay(state, now)
        for row, new in zip(state.counts, table, strict=True):
            for e, c in enumerate(new):
                row[e] += c

    def counts(self, deployment: str, now: float) -> list[list[float]] | None:
        state = self._by_deployment.get(deployment)
        if state is None:
            return None
        self._decay(state, now)
        return [list(row) for row in state.counts]

    def propose(
        self, deployment: str, current: HotnessRanking | None, now: float
    ) -> HotnessRanking | None:
        """The ranking to push now, or None (too little evidence, too soon, no drift)."""
        state = self._by_deployment.get(deployment)
        if state is None or now - state.last_proposed_at < self.config.min_interval_s:
            return None
        self._decay(state, now)
        if min(sum(row) for row in state.counts) < self.config.min_tokens_per_layer:
            return None
        candidate = HotnessRanking.from_counts(state.counts, source="online hotness")
        if current is not None and self.drift(candidate, current) <= self.config.drift_threshold:
            return None
        state.last_proposed_at = now
        return candidate

    @staticmethod
    def drift(candidate: HotnessRanking, current: HotnessRanking) -> float:
        """Max over layers of the TV distance; 1.0 when the shapes differ (another model)."""
        shape = (candidate.num_layers, candidate.num_experts)
        if shape != (current.num_layers, current.num_experts):
            return 1.0
        return max(candidate.total_variation(current, layer) for layer in range(shape[0]))

    def _decay(self, state: _Counts, now: float) -> None:
        elapsed = max(0.0, now - state.updated_at)
        if elapsed == 0.0:
            return
        factor = 0.5 ** (elapsed / self.config.half_life_s)
        for row in state.counts:
            for e in range(len(row)):
                row[e] *= factor
        state.updated_at = now


def _shape(table: Sequence[Sequence[float]]) -> tuple[int, int]:
    return len(table), len(table[0])
