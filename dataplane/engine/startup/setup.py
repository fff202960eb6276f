"""Engine start-up decisions, made once before the pool exists: the page geometry, the
memory budget, the activation reserve, the loading buffers' size, and the kernels compiled
before serving. Which compute path serves the device is compute_paths.py's; the CUDA
graphs' plan is graph_setup.py's; start-up residency is live_policy.py's.

Each is a function of what it is given (the config and the `LoadedModel`), so `rimuru
plan` (capacity.py) runs the same decisions on shapes alone.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from rimuru.dataplane.engine.forward.block_table_store import DeviceBlockTables
from rimuru.dataplane.engine.startup.budget import (
    device_memory_bytes,
    estimate_activation_bytes,
)
from rimuru.dataplane.engine.startup.config import EngineConfig
from rimuru.dataplane.engine.startup.loaded_model import LoadedModel
from rimuru.dataplane.memory.geometry import BLOCK_SIZE, PageGeometry
from rimuru.dataplane.model.config import ModelConfig
from rimuru.dataplane.policies import memory_policy
from rimuru.policy import Tunables

if TYPE_CHECKING:
    from rimuru.dataplane.engine.startup.compute_paths import ComputePaths

log = logging.getLogger(__name__)


def check_max_model_len(max_model_len: int | None, mc: ModelConfig) -> None:
    """A context past the model's positions is refused (as vLLM does), not cut silently."""
    if max_model_len is not None and max_model_len > mc.max_position_embeddings:
        raise ValueError(
            f"max_model_len={max_model_len} exceeds the model's context of "
            f"{mc.max_position_embeddings} tokens: give at most that, or leave it unset"
        )


def buffer_slots(c: EngineConfig, mc: ModelConfig) -> int:
    """Experts per loading buffer: given, or what the policy can leave off a layer."""
    if c.loading_buffer_slots is not None:
        return c.loading_buffer_slots  # >= 1: EngineConfig refuses less
    return memory_policy(c.tunables).loading_slots(mc.num_experts, c.tunables)


def num_loading_buffers(c: EngineConfig) -> int:
    """Host copies alternate two buffers (prefetch into one while the other is read); device
    copy-in copies and computes on one stream, so one buffer serves every layer in turn."""
    return 1 if c.expert_copy == "device" else 2


def loading_buffer_bytes(c: EngineConfig, slots: int, geometry: PageGeometry) -> int:
    """Host copies: the buffers outside the pool. Device copy-in takes its slots from the
    pool as experts leave it (device_copy.py) and keeps one unread slot outside."""
    rows = 3 if c.expert_copy == "device" else 3 * slots
    return num_loading_buffers(c) * rows * geometry.expert_page_bytes


def check_buffer_fits(tunables: Tunables, num_experts: int, slots: int) -> None:
    """Elastic: a layer's offloaded experts must all fit one loading buffer (sized at start)."""
    limit = min(tunables.expert_offload_limit, num_experts)
    if memory_policy(tunables).moves_boundary and limit > slots:
        raise ValueError(
            f"expert_offload_limit={tunables.expert_offload_limit} exceeds the loading "
            f"buffers' {slots} slots set at start-up: restart with loading_buffer_slots "
            f">= {limit} (--loading-buffer-slots) or keep the limit <= {slots}"
        )


def check_offload_fits(mode: str, offloaded: int, slots: int) -> None:
    """Start-up residency may leave at most one loading buffer's worth off any layer."""
    if offloaded > slots:
        raise ValueError(
            f"the {mode} policy leaves {offloaded} experts of a layer on the host but a "
            f"loading buffer holds {slots}: raise loading_buffer_slots to >= {offloaded} or "
            f"the memory budget"
        )


def budget_bytes(c: EngineConfig, loaded: LoadedModel) -> int:
    """Bytes for everything the engine keeps on the device: given, a share of the device's
    memory, 90% of a GPU, or on the CPU everything resident plus room for short requests."""
    if c.memory_budget is not None:
        return c.memory_budget
    if c.gpu_memory_utilization is not None:
        return int(c.gpu_memory_utilization * device_memory_bytes(loaded.device))
    if loaded.device.type == "cuda":
        return int(0.9 * device_memory_bytes(loaded.device))
    mc = loaded.config
    experts = mc.num_moe_layers * mc.num_experts * 3 * loaded.geometry.expert_page_bytes
    return loaded.non_pool_weight_bytes + 2 * experts + 256 * 2**20


def activation_reserve(c: EngineConfig, loaded: LoadedModel, paths: ComputePaths) -> int:
    """Given, measured by a profiling forward (CUDA, with the serving kernels), or
    estimated (CPU: no peak-memory counter).

    On CUDA the reserve also holds the device block-table store, which the engine keeps
    for its life beside the activations (block_table_store.py; 120 MiB for a 48-layer
    model at 256 sequences x 40,960 tokens). The CPU estimate stands alone: its 25% margin
    covers the store at the CPU's scale (8 MiB for `tiny`), and the CPU budgets of the
    tests and the quick start are set against it."""
    if c.activation_reserve is not None:
        return c.activation_reserve
    store = 0
    if loaded.device.type == "cuda":
        store = DeviceBlockTables.nbytes(
            loaded.config.num_kv_layers, c.max_num_seqs, loaded.max_model_len, BLOCK_SIZE
        )
    # the profiling forward drives MoETransformer's pieces; a hybrid model is estimated
    if loaded.device.type == "cuda" and paths.use_kernels and not loaded.config.is_hybrid:
        from rimuru.dataplane.engine.forward.profile_run import (
            measure_activation_bytes,
            prepare_profiling_forward,
        )

        forward = prepare_profiling_forward(
            loaded.model,
            loaded.host_experts,
            loaded.geometry,
            c.max_num_batched_tokens,
            c.max_num_seqs,
            paths.moe_kernel(),
            paths.attention_kernels(),
        )
        measured = measure_activation_bytes(forward, loaded.device)
        del forward  # it holds the scratch pool: give that back before the engine's pool
        torch.cuda.empty_cache()
        return int(measured * 1.1) + store  # 10% headroom for allocator fragmentation
    return store + estimate_activation_bytes(
        loaded.config, c.max_num_batched_tokens, c.max_num_seqs, loaded.dtype
    )


def warm_up_kernels(c: EngineConfig, loaded: LoadedModel, paths: ComputePaths) -> None:
    """CUDA with Triton kernels: compile every kernel variant serving will launch now, not
    in the middle of serving (warmup.py). Runs before the pool: its scratch must not count
    against the budget."""
    if not (c.warmup and loaded.device.type == "cuda" and paths.use_kernels):
        return
    from rimuru.dataplane.engine.startup.warmup import warm_up_routing_histogram, warm_up_sampler

    warm_up_sampler(loaded.config.vocab_size, loaded.device)
    mc = loaded.config
    warm_up_routing_histogram(paths.routing_histogram(), mc.num_experts, mc.top_k, loaded.device)
    if mc.is_hybrid:  # warmup.py drives MoETransformer's pieces
        log.info("warm-up: skipped for a hybrid model; kernels compile on first use")
        return
    from rimuru.dataplane.engine.startup.warmup import warm_up, warmup_batches
    from rimuru.kernels import decode_warmup_contexts, fused_moe_variant

    device = loaded.device

    def moe_key(num_tokens: int):
        return fused_moe_variant(
            num_tokens, mc.top_k, mc.num_experts, mc.moe_intermediate_size, mc.hidden_size,
            loaded.dtype, device,
        )  # fmt: skip

    contexts = decode_warmup_contexts(mc.num_kv_heads, loaded.max_model_len, device)
    batches = warmup_batches(
        c.max_num_batched_tokens, c.max_num_seqs, loaded.max_model_len, BLOCK_SIZE,
        moe_key, contexts,
    )  # fmt: skip
    log.info("warm-up: compiling kernels for %d batch shapes before serving", len(batches))
    seconds = warm_up(
        loaded.model, loaded.host_experts, loaded.geometry, batches, paths.moe_kernel(),
        paths.attention_kernels(),
    )  # fmt: skip
    copy = paths.copy_kernel()
    if copy is not None:  # device copy-in: its one variant (nothing routed: no copy)
        w = loaded.host_experts[0]
        E, inter, hidden = w.w1.shape
        copy(
            torch.zeros(E, dtype=torch.int64, device=device),
            torch.full((1,), -1, dtype=torch.int32, device=device),
            w.w1, w.w3, w.w2,
            torch.empty(3, inter * hidden, dtype=w.w1.dtype, device=device),
            torch.arange(3, dtype=torch.int32, device=device),  # the unused slot's rows
            torch.zeros(1, dtype=torch.int32, device=device),
        )  # fmt: skip
    torch.cuda.empty_cache()  # the scratch pool goes back before the engine's pool
    log.info("warm-up: %d batch shapes in %.1f s", len(batches), seconds)
