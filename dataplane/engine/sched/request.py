"""A request's lifecycle inside the engine: sampling parameters, state, timings."""

from __future__ import annotations

import enum
import math
import time
from dataclasses import dataclass, field

from rimuru.dataplane.memory.tables import BlockTable, StatePages

# Bounds the work and memory one request's stop set can cost. OpenAI takes 4 stop strings;
# vLLM's GPU sampler holds 128 stop ids (for min_tokens), which some models' stop sets
# outgrow; 1024 is vLLM's limit on allowed_token_ids and logit_bias entries.
MAX_STOP_TOKEN_IDS = 1024

# Stands in a request's output for a token still being sampled on the device: with async
# scheduling the next round is scheduled, and launched, before the step in flight is read
# back. The forward takes the real token from the device (in_flight.py); it is never sampled.
PLACEHOLDER = -1


MAX_SEED = 2**64 - 1  # the wire's uint64 and the largest seed a torch generator takes


@dataclass(frozen=True)
class SamplingParams:
    """As in vLLM: temperature 0 = greedy; top_k 0 or -1 = off; top_p 1.0 = off."""

    max_tokens: int = 64
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    stop_token_set: frozenset[int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if (
            not (isinstance(self.temperature, int | float) and math.isfinite(self.temperature))
            or self.temperature < 0
        ):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not isinstance(self.top_k, int) or self.top_k < -1:
            raise ValueError(f"top_k must be -1, 0 (off) or a positive integer, got {self.top_k!r}")
        if not (isinstance(self.top_p, int | float) and 0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p!r}")
        if self.seed is not None and (
            not isinstance(self.seed, int) or not 0 <= self.seed <= MAX_SEED
        ):
            raise ValueError(f"seed must be an integer in [0, 2**64 - 1], got {self.seed!r}")
        stop = tuple(self.stop_token_ids)
        if len(stop) > MAX_STOP_TOKEN_IDS:
            raise ValueError(
                f"stop_token_ids must hold at most {MAX_STOP_TOKEN_IDS} ids, got {len(stop)}"
            )
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in stop))
        if any(t < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be token ids (>= 0), got {list(stop)}")
        # the engine checks every sampled token against it: a set, built once per request
        object.__setattr__(self, "stop_token_set", frozenset(self.stop_token_ids))


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED_STOPPED = "finished_stopped"  # EOS or a stop token
    FINISHED_LENGTH = "finished_length"  # max_tokens
    FINISHED_ABORTED = "finished_aborted"
    # The engine gave up on it: no state of the pool could hold it (liveness.py), or its
    # logits were not finite. `Request.error` says why.
    FINISHED_REFUSED = "finished_refused"
    FINISHED_ERROR = "finished_error"

    @property
    def finished(self) -> bool:
        return self.value.startswith("finished")


class RequestRefused(ValueError):
    """The engine gave up on a request it had queued: no state of the pool holds it."""


def raise_if_failed(request: Request) -> None:
    """For callers that run requests to completion: a refused request raises as bad input
    (RequestRefused, a ValueError), one whose step failed as a RuntimeError."""
    if request.status is RequestStatus.FINISHED_REFUSED:
        raise RequestRefused(request.error)
    if request.status is RequestStatus.FINISHED_ERROR:
        raise RuntimeError(request.error)


@dataclass
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    num_layers: int  # layers with a KV cache: the block table's width
    arrival_time: float = field(default_factory=time.monotonic)
    output_token_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0  # tokens whose KV is in the cache
    num_pending: int = 0  # PLACEHOLDERs that end output_token_ids (async scheduling)
    num_preemptions: int = 0
    first_token_time: float | None = None
    finish_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    block_table: BlockTable = field(init=False)
    state_pages: StatePages | None = None  # a hybrid model's, while it has a place
    error: str | None = None  # why it finished refused or in error
    # Prefix caching (prefix_cache.py): the hash of each full prompt block, set when it is
    # added; its first num_shared_blocks blocks are shared (held in the prefix cache);
    # shares_no_more: one of its blocks was named already, so it registers none after it.
    block_hashes: list[bytes] = field(default_factory=list)
    num_shared_blocks: int = 0
    shares_no_more: bool = False
    num_cached_tokens: int | None = None  # prompt tokens found cached when first admitted

    def __post_init__(self) -> None:
        self.block_table = BlockTable(self.num_layers)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def token_ids(self, start: int, n: int) -> list[int]:
        """Tokens start .. start + n - 1 of prompt + output, without joining the two."""
        prompt = self.prompt_token_ids
        if start + n <= len(prompt):
            return prompt[start : start + n]
        if start >= len(prompt):
            return self.output_token_ids[start - len(prompt) : start - len(prompt) + n]
        return prompt[start:] + self.output_token_ids[: start + n - len(prompt)]

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_tokens_to_compute(self) -> int:
        """Tokens not yet in the KV cache: a prompt (chunk), or the last sampled token."""
        return self.num_tokens - self.num_computed_tokens

    @property
    def num_output_tokens(self) -> int:
        """Output tokens sampled and read back (placeholders not counted)."""
        return len(self.output_token_ids) - self.num_pending

    @property
    def awaits_last_token(self) -> bool:
        """Its max_tokens-th token is being sampled: there is nothing left to schedule."""
        return self.num_pending > 0 and len(self.output_token_ids) >= self.params.max_tokens

    def drop_pending(self) -> None:
        """Forget the placeholders of tokens that will not be read (it finished first)."""
        if self.num_pending:
            del self.output_token_ids[-self.num_pending :]
            self.num_pending = 0

    # ---- per-request latencies (seconds), as vLLM reports them
    @property
    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def e2e_latency(self) -> float | None:
        return None if self.finish_time is None else self.finish_time - self.arrival_time

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first."""
        if len(self.token_times) < 2:
            return None
        return (self.token_times[-1] - self.token_times[0]) / (len(self.token_times) - 1)
