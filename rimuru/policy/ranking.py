"""Hotness ranking: per layer, experts ordered hottest first with routing probabilities.

File format (JSON, `rimuru.hotness/v1`; `num_layers`, `num_experts` and `source` optional):

    {"format": "rimuru.hotness/v1", "num_layers": L, "num_experts": E,
     "source": "free text: how it was measured",
     "layers": [{"order": [e0, e1, ...], "prob": [p(e0), p(e1), ...]}, ...]}

`order` is a permutation of 0..E-1 (the same E in every layer), hottest first; `prob[i]`
is the mean routing probability of expert `order[i]` (non-increasing, each in [0, 1]).
A ranking the control plane accepts is therefore one every data plane can apply.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rimuru.policy.errors import InvalidPolicy

FORMAT = "rimuru.hotness/v1"


@dataclass(frozen=True)
class HotnessRanking:
    order: tuple[tuple[int, ...], ...]  # [L][E] expert ids, hottest first
    prob: tuple[tuple[float, ...], ...]  # [L][E] probability of order[l][i]
    # How it was measured; not content: two rankings of the same numbers are equal.
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not self.order:
            raise InvalidPolicy("layers", "a ranking needs at least one layer")
        if len(self.order) != len(self.prob):
            raise InvalidPolicy(
                "layers", f"{len(self.order)} layers of order, {len(self.prob)} of prob"
            )
        num_experts = len(self.order[0])
        for layer, (order, prob) in enumerate(zip(self.order, self.prob, strict=True)):
            where = f"layers[{layer}]"
            if num_experts == 0 or sorted(order) != list(range(num_experts)):
                raise InvalidPolicy(
                    f"{where}.expert_ids",
                    f"must be a permutation of 0..{num_experts - 1} (the same experts in "
                    "every layer)",
                )
            if len(prob) != num_experts:
                raise InvalidPolicy(
                    f"{where}.probabilities", f"{len(prob)} probabilities for {num_experts} experts"
                )
            if any(not (math.isfinite(p) and 0.0 <= p <= 1.0) for p in prob):
                raise InvalidPolicy(f"{where}.probabilities", "each must lie in [0, 1]")
            if any(a < b for a, b in itertools.pairwise(prob)):
                raise InvalidPolicy(
                    f"{where}.probabilities", "must be non-increasing (hottest expert first)"
                )

    @property
    def num_layers(self) -> int:
        return len(self.order)

    @property
    def num_experts(self) -> int:
        return len(self.order[0])

    @classmethod
    def from_counts(cls, counts: Sequence[Sequence[float]], source: str = "") -> HotnessRanking:
        """Rank from per-layer routing counts (or probability mass) [L][E]; ties by id."""
        order, prob = [], []
        for layer_counts in counts:
            total = float(sum(layer_counts)) or 1.0
            ranked = sorted(range(len(layer_counts)), key=lambda e: (-layer_counts[e], e))
            order.append(tuple(ranked))
            prob.append(tuple(layer_counts[e] / total for e in ranked))
        return cls(tuple(order), tuple(prob), source)

    @classmethod
    def uniform(cls, num_layers: int, num_experts: int) -> HotnessRanking:
        return cls.from_counts([[1.0] * num_experts] * num_layers, source="uniform")

    def probability(self, layer: int, expert: int) -> float:
        return self._prob_by_expert[layer][expert]

    @property
    def _prob_by_expert(self) -> list[list[float]]:
        cached = self.__dict__.get("_cache")
        if cached is None:
            cached = []
            for order, prob in zip(self.order, self.prob, strict=True):
                row = [0.0] * len(order)
                for e, p in zip(order, prob, strict=True):
                    row[e] = p
                cached.append(row)
            object.__setattr__(self, "_cache", cached)
        return cached

    def share(self, layer: int, expert: int) -> float:
        """The expert's share of its layer's routed pairs: its probability over the layer's
        sum (a file need not have normalised them), uniform where the layer sums to 0."""
        cached = self.__dict__.get("_shares")
        if cached is None:
            cached = []
            for row in self._prob_by_expert:
                total = sum(row)
                cached.append([p / total for p in row] if total > 0 else [1 / len(row)] * len(row))
            object.__setattr__(self, "_shares", cached)
        return cached[layer][expert]

    def total_variation(self, other: HotnessRanking, layer: int) -> float:
        """TV(p, q) = 1/2 * sum_e |p(e) - q(e)| of one layer's routing distributions."""
        p, q = self._prob_by_expert[layer], other._prob_by_expert[layer]
        return 0.5 * sum(abs(a - b) for a, b in zip(p, q, strict=True))

    def digest(self) -> str:
        """sha256 of the canonical JSON of the layers: same numbers, same digest. The
        control plane stores it (RankingRef.digest): its form must not change."""
        canonical = [
            [layer, list(order), [float(p) for p in prob]]
            for layer, (order, prob) in enumerate(zip(self.order, self.prob, strict=True))
        ]
        text = json.dumps(canonical, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    def to_json(self) -> dict:
        return {
            "format": FORMAT,
            "num_layers": self.num_layers,
            "num_experts": self.num_experts,
            "source": self.source,
            "layers": [
                {"order": list(o), "prob": list(p)}
                for o, p in zip(self.order, self.prob, strict=True)
            ],
        }

    @classmethod
    def from_json(cls, data: dict) -> HotnessRanking:
        if data.get("format") != FORMAT:
            raise ValueError(
                f"not a hotness ranking: format is {data.get('format')!r}, want {FORMAT!r}"
            )
        if "layers" not in data:
            raise ValueError("hotness ranking file lacks layers")
        layers = data["layers"]
        if "num_layers" in data and len(layers) != data["num_layers"]:
            raise ValueError("num_layers does not match the number of layers")
        try:
            return cls(
                tuple(tuple(int(e) for e in layer["order"]) for layer in layers),
                tuple(tuple(float(p) for p in layer["prob"]) for layer in layers),
                data.get("source", ""),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed hotness ranking layer entry: {exc!r}") from exc

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1))

    @classmethod
    def load(cls, path: str | Path) -> HotnessRanking:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"cannot read hotness ranking {path}: {exc}") from exc
        return cls.from_json(data)

    @classmethod
    def for_model(
        cls, path: str | Path | None, num_layers: int, num_experts: int
    ) -> HotnessRanking:
        """The ranking start-up residency follows: the file's, or uniform without one. A ranking
        of another shape is refused: planned or served on, it would index experts the model
        lacks (the engine and `rimuru plan` both load it here, so they say the same)."""
        ranking = cls.load(path) if path else cls.uniform(num_layers, num_experts)
        if ranking.num_layers != num_layers or ranking.num_experts != num_experts:
            raise ValueError(
                f"hotness ranking is for {ranking.num_layers} layers x {ranking.num_experts} "
                f"experts; the model has {num_layers} x {num_experts}"
            )
        return ranking
