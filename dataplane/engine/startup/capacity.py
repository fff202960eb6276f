"""Capacity planning without weights: how a budget splits, and how much KV cache each policy
gets, for a model that may not fit this machine.

The figures come from the engine's own set-up code run on shapes alone: the checkpoint
layout built over `meta` tensors (no bytes) gives the non-pool weights, then the same
`plan_memory`, `initial_experts` and page allocator the engine uses give the pool, the
experts resident at start and the KV pages left. Only the activation reserve differs: the
engine measures it with a profiling forward on CUDA, the plan estimates it (or takes
`activation_reserve`), so on a GPU the engine's pool is a little smaller than planned.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

import torch

from rimuru.dataplane.engine.startup.budget import (
    MemoryPlan,
    device_memory_bytes,
    estimate_activation_bytes,
    plan_memory,
)
from rimuru.dataplane.engine.startup.config import EngineConfig
from rimuru.dataplane.engine.startup.loaded_model import expert_scale_bytes, page_geometry
from rimuru.dataplane.engine.startup.residency import initial_experts, max_offloaded
from rimuru.dataplane.engine.startup.setup import (
    buffer_slots,
    check_buffer_fits,
    check_max_model_len,
    check_offload_fits,
    loading_buffer_bytes,
)
from rimuru.dataplane.memory.allocator import PageAllocator
from rimuru.dataplane.memory.geometry import BLOCK_SIZE, PageGeometry, PageType
from rimuru.dataplane.model.checkpoint import PRESETS, model_config
from rimuru.dataplane.model.checkpoint.hf_layout import build_global_weights, build_layer_weights
from rimuru.dataplane.model.checkpoint.hybrid_layout import build_hybrid_layer_weights
from rimuru.dataplane.model.checkpoint.shard import shard_config
from rimuru.dataplane.model.config import ModelConfig, parse_dtype
from rimuru.dataplane.policies import memory_policy
from rimuru.policy import EXPERT_MATRICES, HotnessRanking
from rimuru.sizes import format_bytes

_ROUTER_BIAS_ITEMSIZE = 4  # the presets' skew bias is fp32


def non_pool_weight_bytes(mc: ModelConfig, dtype: torch.dtype, router_skew: float) -> int:
    """Bytes of every weight that stays on the device outside the pool (tied lm_head once)."""

    def meta(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, device="meta")

    tensors = list(vars(build_global_weights(mc, meta)).values())
    for layer in range(mc.num_layers):
        if mc.is_hybrid:
            w = build_hybrid_layer_weights(mc, layer, meta)
            mixer = w.mixer
        else:
            w = build_layer_weights(mc, layer, meta)
            mixer = w.attention
        tensors += [*vars(mixer).values(), w.input_norm, w.post_attention_norm, w.router]
        for block in (w.shared_expert, w.dense_mlp):
            if block is not None:
                tensors += vars(block).values()
    by_id = {id(t): t.numel() * t.element_size() for t in tensors if t is not None}
    bias = mc.num_moe_layers * mc.num_experts * _ROUTER_BIAS_ITEMSIZE if router_skew else 0
    return sum(by_id.values()) + bias + expert_scale_bytes(mc)


@dataclass(frozen=True)
class PolicyCapacity:
    policy: str
    plan: MemoryPlan
    experts_at_start: int  # routed experts in pool pages at start-up
    kv_tokens_at_start: int  # tokens of KV cache (all attention layers) the rest holds
    experts_at_least: int  # the fewest the policy ever keeps resident
    kv_tokens_at_most: int  # KV tokens when that few are resident


@dataclass(frozen=True)
class CapacityPlan:
    model_config: ModelConfig
    geometry: PageGeometry
    non_pool_weight_bytes: int
    expert_bytes: int  # all routed experts
    activation_reserve_bytes: int
    policies: tuple[PolicyCapacity | str, ...]  # a string: why that policy does not fit

    @property
    def state_bytes_per_request(self) -> int:
        """A hybrid request's SSM and conv pages (slots, padding included); else 0."""
        return self.geometry.state_bytes(len(self.model_config.linear_attention_layers))

    def requests_of(self, kv_tokens: int, context_len: int) -> int:
        """Requests of `context_len` tokens the KV tokens' pages hold, each also paying its
        state pages (a hybrid's) out of the same pages."""
        g, mc = self.geometry, self.model_config
        per_token = g.kv_page_bytes * mc.num_kv_layers / g.shape.block_size
        return int(
            kv_tokens * per_token // (context_len * per_token + self.state_bytes_per_request)
        )


def plan_capacity(config: EngineConfig, policies: tuple[str, ...]) -> CapacityPlan:
    """`config.memory_budget` is required; `config.tunables.mode` is replaced per policy."""
    if config.memory_budget is None:
        raise ValueError("capacity planning needs a memory budget in bytes (--memory-budget)")
    skew = config.router_skew if config.model in PRESETS else 0.0
    mc = model_config(config.model)  # shapes only: no weights are read
    check_max_model_len(config.max_model_len, mc)
    if config.tensor_parallel_size > 1:  # rank 0's slice: every figure is per GPU
        mc = shard_config(mc, config.tensor_parallel_size)
    dtype = parse_dtype(config.dtype) if config.dtype else mc.dtype
    geometry = page_geometry(mc, dtype)
    non_pool = non_pool_weight_bytes(mc, dtype, skew)
    reserve = config.activation_reserve
    if reserve is None:
        reserve = estimate_activation_bytes(
            mc, config.max_num_batched_tokens, config.max_num_seqs, dtype
        )
    # A ranking of another shape fails the plan, not one policy.
    ranking = HotnessRanking.for_model(config.hotness_path, mc.num_moe_layers, mc.num_experts)
    results: list[PolicyCapacity | str] = []
    for policy in policies:
        try:
            results.append(
                _policy(config.with_mode(policy), mc, geometry, non_pool, reserve, ranking)
            )
        except ValueError as exc:
            results.append(str(exc))
    experts = mc.num_moe_layers * mc.num_experts * 3 * geometry.expert_page_bytes
    return CapacityPlan(mc, geometry, non_pool, experts, reserve, tuple(results))


def check_before_loading(config: EngineConfig, device: torch.device) -> None:
    """Refuse, before a weight is built (and before `rimuru serve` opens its port), an
    unknown model or a directory without config.json, a max_model_len past the model's, and
    a memory budget the device cannot hold or that cannot hold the policy: a preset builds
    every expert on the host first (minutes and tens of GB for a 30B model), and a budget
    beyond the machine fails deep in torch.

    On the CPU the engine estimates its activation reserve as the plan does, so the plan's
    verdict is the engine's. On CUDA it measures the reserve and adds the graphs' memory
    later, so the plan leaves both out (unless a reserve is given) and refuses only what no
    reserve could make fit."""
    check_max_model_len(config.max_model_len, model_config(config.model))
    if config.memory_budget is None:
        return
    budget = config.memory_budget
    if device.type == "cuda":
        total, where = device_memory_bytes(device), f"{device}"
    else:
        total, where = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "this host"
    if budget > total:
        raise ValueError(
            f"the memory budget {format_bytes(budget)} exceeds the {format_bytes(total)} of "
            f"{where}: give a smaller --memory-budget"
        )
    if device.type == "cuda" and config.activation_reserve is None:
        config = replace(config, activation_reserve=0)
    (fit,) = plan_capacity(config, (config.tunables.mode,)).policies
    if isinstance(fit, str):
        raise ValueError(
            f"the {config.tunables.mode} policy does not fit a memory budget of "
            f"{format_bytes(budget)}: {fit} (`rimuru plan` shows how a budget splits)"
        )


def _policy(
    config: EngineConfig,
    mc: ModelConfig,
    geometry: PageGeometry,
    non_pool: int,
    reserve: int,
    ranking: HotnessRanking,
) -> PolicyCapacity:
    t = config.tunables
    slots = buffer_slots(config, mc)
    check_buffer_fits(t, mc.num_experts, slots)
    plan = plan_memory(
        config.memory_budget,
        non_pool,
        reserve,
        loading_buffer_bytes(config, slots, geometry),
        geometry,
    )
    allocator = PageAllocator(geometry, plan.num_huge_pages)
    pool_slots = slots if config.expert_copy == "device" else 0  # slots in pool pages
    chosen = initial_experts(
        t, ranking, allocator.num_free(PageType.EXPERT), config.fixed_expert_share, pool_slots
    )
    offloaded = max_offloaded(chosen, mc.num_moe_layers, mc.num_experts)
    check_offload_fits(t.mode, offloaded, slots)
    slot_experts = min(pool_slots, offloaded)  # a slot takes an expert's pages
    expert_pages = (len(chosen) + slot_experts) * EXPERT_MATRICES
    if expert_pages > allocator.num_free(PageType.EXPERT):
        raise ValueError(
            f"the pool ({format_bytes(plan.pool_bytes)}) cannot hold the {len(chosen)} experts "
            f"the {t.mode} policy keeps resident "
            f"({format_bytes(expert_pages * geometry.expert_page_bytes)}): raise the memory "
            f"budget or choose a policy that offloads experts (fixed/elastic)"
        )
    at_start = _kv_tokens(geometry, plan, len(chosen) + slot_experts, mc.num_kv_layers)
    least, least_slots = len(chosen), slot_experts
    policy = memory_policy(t)
    if policy.moves_boundary:
        least = mc.num_moe_layers * policy.least_kept(mc.num_experts, t)
        least_slots = min(pool_slots, mc.num_experts - least // mc.num_moe_layers)
    at_most = _kv_tokens(geometry, plan, least + least_slots, mc.num_kv_layers)
    return PolicyCapacity(t.mode, plan, len(chosen), at_start, least, at_most)


def _kv_tokens(
    geometry: PageGeometry,
    plan: MemoryPlan,
    num_experts: int,
    num_layers: int,
) -> int:
    """KV tokens the pool holds once `num_experts` experts take their pages (a token needs
    one KV slot in every attention layer)."""
    allocator = PageAllocator(geometry, plan.num_huge_pages)
    for i in range(num_experts):
        if allocator.allocate(PageType.EXPERT, EXPERT_MATRICES, ("expert", i)) is None:
            raise ValueError(f"the pool cannot hold {num_experts} experts")
    return allocator.num_free(PageType.KV) // num_layers * BLOCK_SIZE
