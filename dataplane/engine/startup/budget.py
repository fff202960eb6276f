"""How the memory budget splits: non-pool weights, activation reserve, loading buffers, pool.

    budget = non-pool weights (embeddings, attention, norms, routers, shared experts, lm_head)
           + activation reserve (peak of a profiling forward at max_num_batched_tokens)
           + two loading buffers (2 x slots x 3 expert pages)
           + pool (whole huge pages: experts and KV cache share it)

Computed once at start-up into a frozen `MemoryPlan`; the engine logs it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from rimuru.dataplane.memory.geometry import PageGeometry
from rimuru.dataplane.model.config import ModelConfig
from rimuru.sizes import format_bytes


@dataclass(frozen=True)
class MemoryPlan:
    budget_bytes: int
    non_pool_weight_bytes: int
    activation_reserve_bytes: int
    loading_buffer_bytes: int
    num_huge_pages: int
    huge_page_bytes: int
    cuda_graph_bytes: int = 0  # decode and piecewise graphs' private memory (0 when eager)

    @property
    def pool_bytes(self) -> int:
        return self.num_huge_pages * self.huge_page_bytes

    def describe(self) -> str:
        return (
            f"memory budget {format_bytes(self.budget_bytes)} = non-pool weights "
            f"{format_bytes(self.non_pool_weight_bytes)} + activation reserve "
            f"{format_bytes(self.activation_reserve_bytes)} + "
            + (
                f"CUDA graphs {format_bytes(self.cuda_graph_bytes)} + "
                if self.cuda_graph_bytes
                else ""
            )
            + f"loading buffers {format_bytes(self.loading_buffer_bytes)} + pool "
            f"{format_bytes(self.pool_bytes)} "
            f"({self.num_huge_pages} huge pages of {format_bytes(self.huge_page_bytes)})"
        )


def plan_memory(
    budget_bytes: int,
    non_pool_weight_bytes: int,
    activation_reserve_bytes: int,
    loading_buffer_bytes: int,
    geometry: PageGeometry,
    cuda_graph_bytes: int = 0,
) -> MemoryPlan:
    # the graphs' memory is transient-like: it belongs with the activation reserve
    activation_reserve_bytes += cuda_graph_bytes
    left = budget_bytes - non_pool_weight_bytes - activation_reserve_bytes - loading_buffer_bytes
    num_huge = left // geometry.huge_page_bytes if left > 0 else 0
    if num_huge < 1:
        need = (
            non_pool_weight_bytes
            + activation_reserve_bytes
            + loading_buffer_bytes
            + geometry.huge_page_bytes
        )
        raise ValueError(
            f"memory budget {format_bytes(budget_bytes)} cannot hold the non-pool weights "
            f"({format_bytes(non_pool_weight_bytes)}), the activation reserve "
            f"({format_bytes(activation_reserve_bytes)}), the loading buffers "
            f"({format_bytes(loading_buffer_bytes)}) and one huge page "
            f"({format_bytes(geometry.huge_page_bytes)}): give at least {format_bytes(need)}, "
            f"or lower max_num_batched_tokens"
            + (
                f" (the reserve includes {format_bytes(cuda_graph_bytes)} of CUDA "
                f"graphs; --enforce-eager drops them)"
                if cuda_graph_bytes
                else ""
            )
        )
    return MemoryPlan(
        budget_bytes,
        non_pool_weight_bytes,
        activation_reserve_bytes - cuda_graph_bytes,
        loading_buffer_bytes,
        num_huge,
        geometry.huge_page_bytes,
        cuda_graph_bytes,
    )


def estimate_activation_bytes(
    config: ModelConfig, num_tokens: int, num_seqs: int, dtype: torch.dtype
) -> int:
    """Peak transient memory of one forward of `num_tokens` tokens (upper estimate).

    Live at once inside a layer: the residual stream, its norm, q/k/v/o, the router's fp32
    logits and top-k, the MoE's per-expert [n, I] intermediates (K per token) and output,
    plus the fp32 logits of the sampled rows (at most max_num_seqs of them). Not counted:
    the fused MoE's copy of x in expert order where a GPU table presorts (GemmTile.presort;
    K*D per token plus padding) -- on CUDA the engine measures its reserve with a profiling
    forward instead of using this estimate, and the CPU path does not presort."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    t = num_tokens
    per_token = (
        4 * config.hidden_size
        + config.q_size * 2
        + config.kv_size * 2
        + config.num_experts * 2  # fp32 router logits
        + 3 * config.top_k * config.moe_intermediate_size
        + 3 * config.shared_expert_intermediate_size
    ) * itemsize
    attention_scores = 4 * config.num_heads * min(t, 8192) * 16  # chunked SDPA scratch, fp32
    logits = 4 * config.vocab_size * min(t, num_seqs)
    states = 0
    if config.is_hybrid:  # a GDN layer: its projections, fp32 q/k, and the states gathered
        gdn = config.linear_attention  # for a chunked prefill and the final ones it returns
        per_token += (2 * gdn.conv_dim + 2 * gdn.value_size) * itemsize + 8 * gdn.key_size
        states = 2 * min(t, num_seqs) * math.prod(gdn.ssm_state_shape) * 4
    return math.ceil(1.25 * (t * per_token + attention_scores + logits + states))


def device_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    raise ValueError(
        "gpu_memory_utilization needs a CUDA device; on the CPU give --memory-budget in bytes"
    )
