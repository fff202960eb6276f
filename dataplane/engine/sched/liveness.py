"""The liveness rule the engine keeps: the engine never spins.

In every round the head of the waiting queue either gets tokens scheduled, or the policy
moves pages toward admitting it (the adjuster evicts experts for the shortfall the
scheduler reports, counting KV and state pages together: allocator.expert_pages_short),
or, once no state of the pool could ever hold it, it is refused. `validate_request`
refuses what can never fit before it is queued; this guard is the backstop for what that
count cannot see (pages fragmented among the experts a policy must keep, say):

  * a round that schedules no token while requests wait is stalled; after
    `max_stalled_rounds` of them in a row the head of the waiting queue is refused
    (a stalled round runs no forward, so the bound costs host time only);
  * a request preempted while it ran alone lacked pages with nothing else to take them
    from: under resident and fixed the pool never moves for it, so it is refused at once;
    under elastic, after `max_alone_preemptions` preemptions in a row with nothing changed
    since the one before: the request no longer, no fewer experts resident (while either
    changes the boundary is still moving toward it, not stuck).

A refused request finishes with `RequestStatus.FINISHED_REFUSED` and the reason, which the
planes report as the oversized-prompt error (INVALID_ARGUMENT, HTTP 400, exit 2).
"""

from __future__ import annotations

from dataclasses import dataclass

from rimuru.dataplane.engine.sched.request import Request

# Rounds in a row with requests waiting and no token scheduled. Legitimate waits end in a
# few rounds (the adjuster evicts a shortfall's worth per round, a step in flight is read
# back in the next); the bound only has to outlast those.
MAX_STALLED_ROUNDS = 256
MAX_ALONE_PREEMPTIONS = 3


@dataclass(frozen=True)
class Refusal:
    request: Request
    reason: str


class LivenessGuard:
    def __init__(
        self,
        max_stalled_rounds: int = MAX_STALLED_ROUNDS,
        max_alone_preemptions: int = MAX_ALONE_PREEMPTIONS,
    ):
        if max_stalled_rounds < 1 or max_alone_preemptions < 1:
            raise ValueError("the liveness bounds must be >= 1")
        self.max_stalled_rounds = max_stalled_rounds
        self.max_alone_preemptions = max_alone_preemptions
        self.num_stalled_rounds = 0  # in a row, up to now, of the same waiting head
        self._stalled_head: str | None = None
        # request id -> ((its tokens, experts resident) at its last preemption while alone,
        # preemptions in a row at that state)
        self._alone: dict[str, tuple[tuple[int, int], int]] = {}

    def after_round(
        self, num_scheduled_tokens: int, waiting_head: Request | None, *, in_flight: bool
    ) -> Refusal | None:
        """After a round's scheduling and boundary move: the head to refuse, or None.
        `in_flight`: a launched step is still to be read back (async scheduling): its
        finished requests may yet free pages, so the round does not count as stalled."""
        if num_scheduled_tokens > 0 or waiting_head is None or in_flight:
            self.num_stalled_rounds = 0
            return None
        if waiting_head.request_id != self._stalled_head:  # a new head starts its own count
            self._stalled_head, self.num_stalled_rounds = waiting_head.request_id, 0
        self.num_stalled_rounds += 1
        if self.num_stalled_rounds < self.max_stalled_rounds:
            return None
        self.num_stalled_rounds = 0
        r = waiting_head
        return Refusal(
            r,
            f"request {r.request_id!r} ({len(r.prompt_token_ids)} prompt tokens, max_tokens "
            f"{r.params.max_tokens}) waited {self.max_stalled_rounds} scheduling rounds with "
            f"nothing else running and its pages never came free: this pool cannot hold its "
            f"KV and state pages beside the experts the policy keeps; raise the memory budget, "
            f"shorten the prompt or lower max_tokens",
        )

    def preempted_alone(
        self, request: Request, *, pool_moves: bool, fits: int, num_resident: int
    ) -> Refusal | None:
        """`request` lacked pages while it ran alone. `pool_moves`: the policy may still
        move the boundary for it (elastic); `fits`: tokens validate_request said one request
        holds; `num_resident`: experts in pool pages now."""
        state = (request.num_tokens, num_resident)
        last, n = self._alone.get(request.request_id, (None, 0))
        n = n + 1 if state == last else 1
        self._alone[request.request_id] = (state, n)
        if pool_moves and n < self.max_alone_preemptions:
            return None
        return Refusal(
            request,
            f"request {request.request_id!r} ({len(request.prompt_token_ids)} prompt tokens, "
            f"max_tokens {request.params.max_tokens}) lacked pages {n} time(s) in a row while "
            f"it ran alone (the pool was said to hold {fits} tokens for one request): it can never "
            f"finish in this pool; raise the memory budget or lower max_tokens",
        )

    def forget(self, request_id: str) -> None:
        self._alone.pop(request_id, None)
