"""The profiling forward: how much transient device memory one step at full size needs.

One sequence of `max_num_batched_tokens` prompt tokens runs through the model, with its KV
in a scratch pool and every routed expert read from one loading-buffer slot (activation
memory does not depend on which weights a token meets), then the logits of `max_num_seqs`
rows. The peak allocated above what existed before the forward — the scratch pool and slot
excluded, since they stand in for the engine's own pages — is the activation reserve.
CUDA only: the CPU has no peak counter, so there the engine uses `estimate_activation_bytes`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from rimuru.dataplane.engine.paged_attention import (
    PagedAttention,
    PagedAttentionMeta,
    SequenceSlice,
)
from rimuru.dataplane.memory.geometry import PageGeometry
from rimuru.dataplane.memory.pool import UnifiedPool
from rimuru.dataplane.memory.tables import buffer_slot_id
from rimuru.dataplane.model import MoETransformer
from rimuru.dataplane.model.weights import ExpertWeights


class OneSlotExperts:
    """ExpertBackend for the profiling forward: every expert reads buffer rows 0..2."""

    def __init__(self, experts: ExpertWeights, moe_kernel, device: torch.device):
        w1, w3, w2 = experts.expert(0)
        self.buffer = torch.stack([w.reshape(-1) for w in (w1, w3, w2)]).to(device)  # [3, I*D]
        rows = torch.tensor([buffer_slot_id(i) for i in range(3)], dtype=torch.int32)
        self.table = rows.repeat(experts.num_experts, 1).to(device)  # [E, 3]
        self.moe_kernel = moe_kernel

    def moe(self, layer, x, topk_ids, topk_weights):
        return self.moe_kernel(x, topk_ids, topk_weights, self.buffer, self.buffer, self.table)


def prepare_profiling_forward(
    model: MoETransformer,
    host_experts: list[ExpertWeights],
    geometry: PageGeometry,
    num_tokens: int,
    num_seqs: int,
    moe_kernel,
    attention_kernels,
) -> Callable[[], torch.Tensor]:
    """Allocate the full-size step's scratch (KV pool, one expert slot, inputs) and return
    the forward over it, which returns the logits [min(S, T), V]. Apart so that the
    measurement counts only what the forward itself allocates."""
    device, dtype = model.device, model.dtype
    layers = model.config.num_layers
    num_blocks = math.ceil(num_tokens / geometry.shape.block_size)
    kv_per_huge = geometry.huge_page_bytes // geometry.kv_page_bytes
    scratch = UnifiedPool(geometry, math.ceil(layers * num_blocks / kv_per_huge), dtype, device)
    blocks = np.arange(num_blocks * layers, dtype=np.int64).reshape(num_blocks, layers)
    meta = PagedAttentionMeta.build(
        [SequenceSlice(0, num_tokens, 0, blocks)], layers, geometry.shape.block_size, device
    )
    experts = OneSlotExperts(host_experts[0], moe_kernel, device)
    runner = model.with_backends(PagedAttention(scratch, kernels=attention_kernels), experts)
    generator = torch.Generator(device="cpu").manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (num_tokens,), generator=generator).to(device)
    positions = torch.arange(num_tokens, device=device)

    def forward() -> torch.Tensor:
        hidden = runner.forward(ids, positions, meta)
        return runner.compute_logits(hidden[-min(num_seqs, num_tokens) :])

    return forward


def measure_activation_bytes(forward: Callable[[], torch.Tensor], device: torch.device) -> int:
    """Peak CUDA memory of `forward` (from `prepare_profiling_forward`) above what was
    allocated before it. Its scratch KV pool and expert slot, which stand in for pool pages
    the engine has anyway, already exist: the reserve holds activations only."""
    if device.type != "cuda":
        raise ValueError("the profiling forward measures CUDA memory; use the estimate on CPU")
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    logits = forward()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - base
    del logits
    return int(peak)
