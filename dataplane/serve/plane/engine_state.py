"""What the engine thread reads off the engine: the model's facts once, a snapshot a round.

Runs on the engine thread only (it reads the engine's live state); what it returns is
frozen and may be handed to any thread.
"""

from __future__ import annotations

from rimuru.dataplane.engine.engine import Engine
from rimuru.dataplane.engine.sched.request import SamplingParams
from rimuru.dataplane.memory.geometry import BLOCK_SIZE, PageType
from rimuru.dataplane.serve.plane.events import EngineSnapshot, ModelInfo
from rimuru.policy import EXPERT_MATRICES


def warm_up(engine: Engine) -> ModelInfo:
    """One tiny generate through every layer, so the first client pays no start-up costs."""
    mc = engine.model_config
    token = mc.bos_token_id if mc.bos_token_id is not None else 0
    request_id = engine.add_request([token], SamplingParams(max_tokens=2, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    engine.forget(request_id)
    config = engine.config
    return ModelInfo(
        model_name=config.model,
        preset=config.model if "/" not in config.model else "",
        family=mc.family,
        dtype=str(engine.dtype).removeprefix("torch."),
        vocab_size=mc.vocab_size,
        max_model_len=engine.max_model_len,
        num_layers=mc.num_layers,
        hidden_size=mc.hidden_size,
        num_experts=mc.num_experts,
        num_experts_per_token=mc.top_k,
        moe_intermediate_size=mc.moe_intermediate_size,
        num_kv_heads=mc.num_kv_heads,
        head_dim=mc.head_dim,
        kv_block_size=BLOCK_SIZE,
        eos_token_ids=tuple(mc.eos_token_ids),
        async_scheduling=config.schedules_async,
    )


def take_snapshot(engine: Engine, policy_version: int) -> EngineSnapshot:
    allocator, g, c = engine.allocator, engine.geometry, engine.expert_counters
    cache = engine.prefix_cache
    last = engine.stats[-1] if engine.stats else None
    kv_used = last.num_kv_pages_used if last is not None else allocator.num_owned(PageType.KV)
    kv_free = allocator.num_free(PageType.KV)
    resident = tuple(len(r) for r in engine.residency.resident)
    expert_pages = sum(resident) * EXPERT_MATRICES
    return EngineSnapshot(
        step=engine.step_id,
        num_requests_running=len(engine.scheduler.running),
        num_requests_waiting=len(engine.scheduler.waiting),
        num_pool_pages=engine.pool.num_pages(PageType.EXPERT),
        num_free_pages=allocator.num_free(PageType.EXPERT),
        num_kv_pages=kv_used,
        num_expert_pages=expert_pages,
        kv_cache_usage_perc=kv_used / (kv_used + kv_free) if kv_used + kv_free else 0.0,
        num_experts_resident=resident,
        num_expert_evictions=c.evictions,
        num_expert_loads=c.loads,
        bytes_host_to_device=c.bytes_h2d,
        num_preemptions=engine.scheduler.num_preemptions,
        predictor_hits=c.predictor_hits,
        predictor_needed=c.predictor_needed,
        policy_version=policy_version,
        policy_mode=engine.tunables.mode,
        kv_pool_bytes=kv_used * g.kv_page_bytes,
        expert_pool_bytes=expert_pages * g.expert_page_bytes,
        routing_counts=engine.moe_backend.routing_counts.clone(),
        prefix_cache_queries=cache.num_queried_tokens if cache is not None else 0,
        prefix_cache_hits=cache.num_hit_tokens if cache is not None else 0,
    )
