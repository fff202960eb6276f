"""A step's sampled tokens, taken by their requests: a placeholder holds each token's place
from the step's launch, the token replaces it when the step is read back, stamped with its
time, is checked against the request's stops and is handed out as a streaming delta.

Finishing a request that stopped is the engine's (its scheduler and sampler let it go).
"""

from __future__ import annotations

from collections.abc import Collection

from rimuru.dataplane.engine.sched.outputs import RequestOutput
from rimuru.dataplane.engine.sched.request import PLACEHOLDER, Request, RequestStatus


def add_placeholder(request: Request) -> None:
    """The step just launched samples a token for `request`: hold its place in the output
    (PLACEHOLDER) until the step is read back, so the next round can be scheduled first."""
    request.output_token_ids.append(PLACEHOLDER)
    request.num_pending += 1


def take_sampled(
    request: Request, token: int, now: float, eos_token_ids: Collection[int]
) -> RequestStatus | None:
    """Give `request` the token sampled for it, stamped `now`, in place of its oldest
    placeholder; returns the status the token finishes it with, or None while it runs on."""
    if request.num_pending < 1:
        raise RuntimeError(f"request {request.request_id!r} has no token being sampled")
    request.output_token_ids[len(request.output_token_ids) - request.num_pending] = token
    request.num_pending -= 1
    request.token_times.append(now)
    if request.first_token_time is None:
        request.first_token_time = now
    return stop_status(request, token, eos_token_ids)


def stop_status(
    request: Request, token: int, eos_token_ids: Collection[int]
) -> RequestStatus | None:
    """Stopped by a stop token or EOS (unless ignored), else by max_tokens, else None.
    `token` is the one just read back: the output already counts it."""
    p = request.params
    if token in p.stop_token_set or (not p.ignore_eos and token in eos_token_ids):
        return RequestStatus.FINISHED_STOPPED
    if request.num_output_tokens >= p.max_tokens:
        return RequestStatus.FINISHED_LENGTH
    return None


def token_output(
    request_id: str, token: int, status: RequestStatus | None, num_cached_tokens: int | None
) -> RequestOutput:
    """The delta a request's sampled token makes: finish_reason "stopped", "length" or
    "aborted" (the status without its "finished_" prefix) once it finished."""
    return RequestOutput(
        request_id,
        (token,),
        status is not None,
        status.value.removeprefix("finished_") if status else None,
        num_cached_tokens=num_cached_tokens,
    )
