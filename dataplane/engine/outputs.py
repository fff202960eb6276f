"""What the engine hands out: streaming deltas per request and counters per step."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RequestOutput:
    """A streaming delta: the tokens a request gained this step."""

    request_id: str
    new_token_ids: tuple[int, ...]
    finished: bool
    finish_reason: str | None = None


@dataclass(frozen=True)
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
