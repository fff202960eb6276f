"""What crosses between the event loop and the engine thread: frozen values only.

    event loop ── GenerateSpec / abort / policy ──> engine thread (owns the Engine)
    event loop <── TokensEvent / FinishedEvent / RejectedEvent, EngineSnapshot ──┘

Nothing here references the engine's mutable objects, so a value can be read on any
thread after it was handed over.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rimuru.dataplane.engine.sched.request import SamplingParams
from rimuru.dataplane.serve.plane.errors import ServeError
from rimuru.policy import HotnessRanking, Tunables


@dataclass(frozen=True)
class GenerateSpec:
    """A validated request, ready for `Engine.add_request`."""

    client_request_id: str  # echoed to the client; the engine uses its own unique id
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    arrival_time: float  # time.monotonic() when the RPC arrived


@dataclass(frozen=True)
class TokensEvent:
    """New tokens of one request, sampled in one step."""

    token_ids: tuple[int, ...]


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    num_preemptions: int
    cached_tokens: int = 0  # prompt tokens the prefix cache held (engine/sched/prefix_cache.py)


@dataclass(frozen=True)
class Timing:
    """Seconds; as the proto's Timing."""

    queue_seconds: float
    time_to_first_token_seconds: float
    mean_inter_token_seconds: float
    e2e_seconds: float


@dataclass(frozen=True)
class FinishedEvent:
    """The request is done ("length", "stopped" or "aborted"); its pages are released."""

    finish_reason: str
    usage: Usage
    timing: Timing


@dataclass(frozen=True)
class RejectedEvent:
    """The engine thread refused the request (queue full, cannot fit): nothing was added."""

    error: ServeError


Event = TokensEvent | FinishedEvent | RejectedEvent


@dataclass(frozen=True)
class PolicyChange:
    """One control-plane version, applied whole or not at all between two steps."""

    version: int
    tunables: Tunables
    ranking: HotnessRanking | None  # None = keep the current ranking


@dataclass(frozen=True)
class ModelInfo:
    model_name: str
    preset: str
    family: str  # qwen2_moe | qwen3_moe | mixtral
    dtype: str
    vocab_size: int
    max_model_len: int
    num_layers: int
    hidden_size: int
    num_experts: int
    num_experts_per_token: int
    moe_intermediate_size: int
    num_kv_heads: int
    head_dim: int
    kv_block_size: int
    eos_token_ids: tuple[int, ...]
    async_scheduling: bool  # EngineConfig.schedules_async


@dataclass(frozen=True)
class EngineSnapshot:
    """The engine's state after one step, published by the engine thread.

    Counters are cumulative since start-up (warm-up excluded where the engine allows)."""

    step: int
    num_requests_running: int
    num_requests_waiting: int
    num_pool_pages: int  # expert-page units: every pool page can hold one expert matrix
    num_free_pages: int
    num_kv_pages: int  # KV pages in use
    num_expert_pages: int  # expert pages holding resident experts
    kv_cache_usage_perc: float
    num_experts_resident: tuple[int, ...]  # per layer
    num_expert_evictions: int
    num_expert_loads: int
    bytes_host_to_device: int
    num_preemptions: int
    predictor_hits: int
    predictor_needed: int
    policy_version: int
    policy_mode: str
    kv_pool_bytes: int  # bytes of the pool in KV pages
    expert_pool_bytes: int  # bytes of the pool in resident experts
    routing_counts: torch.Tensor  # [L, E] int64, cumulative tokens routed; never mutated
    # prompt tokens looked up in the prefix cache and those found (0 with it off), as vLLM's
    # prefix_cache_queries / prefix_cache_hits
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0

    @property
    def predictor_hit_rate(self) -> float:
        return self.predictor_hits / self.predictor_needed if self.predictor_needed else 0.0
