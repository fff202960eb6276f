"""Offline hotness profiling: route sample prompts and rank experts by how often they win."""

from __future__ import annotations

from collections.abc import Sequence

from rimuru.dataplane.engine.engine import Engine
from rimuru.dataplane.engine.sched.request import SamplingParams
from rimuru.policy import HotnessRanking


def profile_hotness(
    engine: Engine, prompts: Sequence[Sequence[int]], source: str = ""
) -> HotnessRanking:
    """Prefill `prompts` (one output token each) and rank experts per layer by routed tokens.

    The memory policy does not change routing, so any engine will do; its counters of
    routed tokens are reset before and after."""
    if not prompts:
        raise ValueError("profiling needs at least one sample prompt")
    engine.moe_backend.reset_routing_counts()
    engine.generate(prompts, SamplingParams(max_tokens=1, ignore_eos=True))
    counts = engine.moe_backend.routing_counts.tolist()
    engine.moe_backend.reset_routing_counts()
    return HotnessRanking.from_counts(counts, source=source or f"{len(prompts)} prompts routed")
