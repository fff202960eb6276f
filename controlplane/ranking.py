"""Hotness rankings as the control plane stores and pushes them.

Per layer, the experts hottest first with their routing probabilities. The rules are the
data plane's (rimuru.dataplane.adjust.hotness), so a ranking the control plane accepts is
one a data plane can apply: layers 0..L-1 each once, every layer a permutation of the same
0..E-1, probabilities in [0, 1] and non-increasing.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

from rimuru.controlplane.errors import InvalidArgument
from rimuru.controlplane.policy import RankingRef

MAX_RANKING_ID_LEN = 128


@dataclass(frozen=True)
class LayerRanking:
    layer: int
    expert_ids: tuple[int, ...]  # hottest first
    probabilities: tuple[float, ...]  # probabilities[i] belongs to expert_ids[i]


@dataclass(frozen=True)
class Ranking:
    ref: RankingRef
    deployment: str
    layers: tuple[LayerRanking, ...]


def check_ranking_id(ranking_id: str) -> str:
    if not ranking_id or len(ranking_id) > MAX_RANKING_ID_LEN or not ranking_id.isprintable():
        raise InvalidArgument(
            "ranking_id",
            f"must be 1..{MAX_RANKING_ID_LEN} printable characters, e.g. 'offline-sharegpt'",
        )
    return ranking_id


def check_layers(layers: Sequence[LayerRanking]) -> tuple[LayerRanking, ...]:
    """Validate and return the layers sorted by layer index."""
    if not layers:
        raise InvalidArgument("layers", "a ranking needs at least one layer")
    ordered = tuple(sorted(layers, key=lambda r: r.layer))
    if [r.layer for r in ordered] != list(range(len(ordered))):
        raise InvalidArgument(
            "layers.layer", f"layers must be 0..{len(ordered) - 1}, each exactly once"
        )
    num_experts = len(ordered[0].expert_ids)
    for r in ordered:
        where = f"layers[{r.layer}]"
        if sorted(r.expert_ids) != list(range(num_experts)) or num_experts == 0:
            raise InvalidArgument(
                f"{where}.expert_ids",
                f"must be a permutation of 0..{num_experts - 1} (the same experts in every layer)",
            )
        if len(r.probabilities) != num_experts:
            raise InvalidArgument(
                f"{where}.probabilities",
                f"{len(r.probabilities)} probabilities for {num_experts} experts",
            )
        if any(not (math.isfinite(p) and 0.0 <= p <= 1.0) for p in r.probabilities):
            raise InvalidArgument(f"{where}.probabilities", "each must lie in [0, 1]")
        if any(a < b for a, b in itertools.pairwise(r.probabilities)):
            raise InvalidArgument(
                f"{where}.probabilities", "must be non-increasing (hottest expert first)"
            )
    return ordered


def digest(layers: Sequence[LayerRanking]) -> str:
    """sha256 of the canonical JSON of the (sorted) layers: same content, same digest."""
    canonical = [
        [r.layer, list(r.expert_ids), [float(p) for p in r.probabilities]]
        for r in sorted(layers, key=lambda r: r.layer)
    ]
    text = json.dumps(canonical, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def layers_from_counts(counts: Sequence[Sequence[float]]) -> tuple[LayerRanking, ...]:
    """Rank per-layer routing counts [L][E]: hottest first, ties by expert id."""
    layers = []
    for layer, row in enumerate(counts):
        total = float(sum(row)) or 1.0
        order = sorted(range(len(row)), key=lambda e: (-row[e], e))
        layers.append(LayerRanking(layer, tuple(order), tuple(row[e] / total for e in order)))
    return tuple(layers)


def layers_from_hotness_json(data: dict) -> tuple[LayerRanking, ...]:
    """Read the data plane's ranking file (format rimuru.hotness/v1) without importing it."""
    if data.get("format") != "rimuru.hotness/v1":
        raise InvalidArgument(
            "format", f"not a hotness ranking: {data.get('format')!r}, want 'rimuru.hotness/v1'"
        )
    return check_layers(
        [
            LayerRanking(
                i, tuple(int(e) for e in row["order"]), tuple(float(p) for p in row["prob"])
            )
            for i, row in enumerate(data["layers"])
        ]
    )
