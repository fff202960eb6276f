"""What the engine hands out: streaming deltas per request and counters per step."""

from __future__ import annotations

import time
from dataclasses import dataclass

from rimuru.dataplane.memory.geometry import PageType


@dataclass(frozen=True)
class RequestOutput:
    """A streaming delta: the tokens a request gained this step."""

    request_id: str
    new_token_ids: tuple[int, ...]
    finished: bool
    finish_reason: str | None = None  # "stopped", "length", "aborted", "refused", "error"
    error: str | None = None  # why, when "refused" (it can never fit) or "error"
    # prompt tokens its first admission found in the prefix cache (None: caching off);
    # the serve layer's prompt_tokens_details.cached_tokens, as vLLM's num_cached_tokens
    num_cached_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class StepStats:
    step: int
    time: float
    num_running: int
    num_waiting: int
    num_scheduled_tokens: int
    num_kv_pages_used: int
    num_expert_pages_used: int
    num_free_bytes: int
    kv_bytes: int
    expert_bytes: int
    num_experts_resident: int
    evictions: int  # cumulative
    loads: int
    buffer_copies: int
    bytes_h2d: int
    predictor_hits: int
    predictor_needed: int
    preemptions: int
    # the round's own moves (make_room's and the adjuster's, round_moves.py): what moved the
    # boundary in this step, where `evictions` and `loads` count since start-up
    evicted: int = 0
    loaded: int = 0
    cached_bytes: int = 0  # of num_free_bytes: KV pages the prefix cache keeps (reclaimable)

    @classmethod
    def capture(
        cls, step, num_tokens, running, scheduler, moves, residency, counters, allocator, pool
    ) -> StepStats:
        """The state after a round: gauges now, counters cumulative since start-up; `running`
        is the scheduler's running queue right after scheduling (the batch in flight, before
        the step's finished requests leave it: counted after, a step that finished all four
        of its requests recorded 0 running); `moves` the round's RoundMoves."""
        g, c = pool.geometry, counters
        kv_used = allocator.num_owned(PageType.KV)
        expert_pages = allocator.num_owned(PageType.EXPERT)
        kv_bytes, expert_bytes = kv_used * g.kv_page_bytes, expert_pages * g.expert_page_bytes
        return cls(
            step,
            time.monotonic(),
            running,
            len(scheduler.waiting),
            num_tokens,
            kv_used,
            expert_pages,
            pool.num_bytes - kv_bytes - expert_bytes,
            kv_bytes,
            expert_bytes,
            residency.num_resident(),
            c.evictions,
            c.loads,
            c.buffer_copies,
            c.bytes_h2d,
            c.predictor_hits,
            c.predictor_needed,
            scheduler.num_preemptions,
            evicted=moves.num_evicted,
            loaded=moves.num_loaded,
            cached_bytes=allocator.num_cached() * g.kv_page_bytes,
        )
