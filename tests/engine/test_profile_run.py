"""The profiling forward runs the full-size step on scratch memory (CPU: torch references)."""

import torch

from rimuru.dataplane.engine.engine import Engine
from rimuru.dataplane.engine.forward.profile_run import prepare_profiling_forward
from rimuru.dataplane.engine.startup.config import EngineConfig
from rimuru.dataplane.memory.geometry import PageType
from rimuru.kernels import fused_moe_paged_reference


def test_profiling_forward_runs_at_full_size_and_touches_no_engine_memory():
    engine = Engine(EngineConfig(activation_reserve=0, max_num_batched_tokens=64), log_plan=False)
    free_before = engine.allocator.num_free(PageType.KV)
    forward = prepare_profiling_forward(
        engine.model, engine.host_experts, engine.geometry, 200, 8, fused_moe_paged_reference, None
    )
    logits = forward()
    assert logits.shape == (8, engine.model_config.vocab_size)
    assert torch.isfinite(logits).all()
    assert engine.allocator.num_free(PageType.KV) == free_before
    engine.check_invariants()
