"""V1-style scheduler: continuous batching with chunked prefill and recompute preemption.

One round (vLLM V1 semantics):
  1. Running requests first, oldest first: each gets its remaining tokens (a prompt chunk
     or one decode token) within the token budget. If its KV pages do not fit, `make_room`
     (elastic: the adjuster evicts experts, within expert_offload_limit) is asked first;
     only when it frees nothing is the newest running request preempted (pages freed, back
     to the front of the waiting queue, recomputed from scratch later), until they fit —
     possibly the request itself. The trade: a preemption recomputes the request later, an
     eviction copies the expert in on every step that routes to it, so which pays depends
     on the load (docs/benchmarks.md); `EngineConfig.evict_to_admit` chooses.
  2. Waiting requests are admitted, oldest first, only if nothing was preempted this round,
     while `max_num_seqs` (and `admit_limit`, when given) and the token budget allow and
     their pages fit; with prefix caching, one starts after its longest cached prefix
     (kv_cache.py), and only the rest counts against the budget.
  3. The shortfall — KV pages that were needed but could not be had, a request's state
     pages counted with them — is reported in the output; the engine converts it to expert
     pages for the adjuster. A request that can never get its pages is refused, never
     left to spin (liveness.py).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rimuru.dataplane.engine.sched.kv_cache import KVCacheManager
from rimuru.dataplane.engine.sched.request import Request, RequestStatus


@dataclass(frozen=True)
class ScheduledRequest:
    request: Request
    num_new_tokens: int


@dataclass(frozen=True)
class RoundState:
    """What the scheduler's hooks see of the round in progress."""

    step: int
    num_running: int
    num_waiting: int


@dataclass(frozen=True)
class SchedulerOutput:
    scheduled: tuple[ScheduledRequest, ...]
    preempted: tuple[str, ...]
    kv_pages_short: int  # pages the round needed but could not get
    # A request preempted while it ran alone: the pool, holding no other request's pages,
    # lacked what it needed next. Unless the boundary moves, it never fits (engine.py).
    preempted_alone: str | None = None

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)


class Scheduler:
    def __init__(
        self,
        kv: KVCacheManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        make_room: Callable[[int, RoundState], int] | None = None,
        admit_limit: Callable[[RoundState], int] | None = None,
    ):
        """`make_room(kv_pages_lacking, round)` frees pool pages for KV now and returns how
        many KV pages it gained (0: nothing more can go). When the request short of pages
        is the only one running (`round.num_running == 1`), preempting would leave nothing
        running: the elastic adjuster then lets it exceed the copy budget, which must not
        stop a lone request (with others running, they progress, and it is re-admitted
        later). `admit_limit(round)`: running requests up to which waiting ones may be
        admitted this round (the elastic copy budget's cap); asked once per round that has
        requests waiting and preempted none. Requests it keeps waiting are not counted as
        short of pages."""
        if max_num_seqs < 1 or max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be >= 1")
        self.kv = kv
        self.make_room = make_room
        self.admit_limit = admit_limit
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def round_state(self, step: int) -> RoundState:
        return RoundState(step, len(self.running), len(self.waiting))

    def schedule(self, step: int) -> SchedulerOutput:
        budget = self.max_num_batched_tokens
        scheduled: list[ScheduledRequest] = []
        preempted: list[str] = []
        short = 0
        alone = None
        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            if request.awaits_last_token:  # async: its last token is in flight, none after
                i += 1
                continue
            num_new = min(request.num_tokens_to_compute, budget)
            counted = False
            while not self.kv.allocate_slots(request, num_new):
                lacking = self.kv.pages_lacking(request, num_new)
                if (
                    self.make_room is not None
                    and self.make_room(lacking, self.round_state(step)) > 0
                ):
                    continue  # room was made: try again before preempting anyone
                if not counted:  # count what this request lacked once, not per retry
                    short += lacking
                    counted = True
                victim = self.running.pop()
                self._preempt(victim, step)
                preempted.append(victim.request_id)
                if victim is request:
                    if not self.running:
                        alone = request.request_id
                    break
            else:
                scheduled.append(ScheduledRequest(request, num_new))
                budget -= num_new
                i += 1
                continue
            break  # the request itself was preempted; everything after it is gone too
        if not preempted and self.waiting:
            cap = self.max_num_seqs
            if self.admit_limit is not None:
                cap = min(cap, self.admit_limit(self.round_state(step)))
            while self.waiting and len(self.running) < cap and budget > 0:
                request = self.waiting[0]
                hit = self.kv.cached_prefix(request)  # its cached blocks are not computed
                num_new = min(request.num_tokens_to_compute - hit.num_tokens, budget)
                if not self.kv.allocate_slots(request, num_new, hit):
                    short += self.kv.pages_lacking(request, num_new, hit)
                    break
                self.waiting.popleft()
                request.status = RequestStatus.RUNNING
                self.running.append(request)
                scheduled.append(ScheduledRequest(request, num_new))
                budget -= num_new
        return SchedulerOutput(tuple(scheduled), tuple(preempted), max(short, 0), alone)

    def computed(self, scheduled: Sequence[ScheduledRequest]) -> None:
        """The round's forward is launched: what it computes is in the KV cache for every
        step queued after it (the forward read the counts before they move)."""
        for s in scheduled:
            s.request.num_computed_tokens += s.num_new_tokens
            self.kv.cache_blocks(s.request)  # full prompt blocks become shared

    def _preempt(self, request: Request, step: int) -> None:
        # The previous forward is the last that read these pages: synchronous scheduling
        # has read it back (it completed); async scheduling reuses them in stream order
        # (memory/reclaim.py), or the round would preempt everyone behind them.
        self.kv.free(request, last_step=step - 1)
        request.num_computed_tokens = 0
        request.status = RequestStatus.WAITING
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)

    def finish(self, request: Request, status: RequestStatus, step: int) -> None:
        """Remove a finished or aborted request and release its pages after `step`."""
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        request.status = status
        self.kv.free(request, last_step=step)
