"""The profiling forward: how much transient device memory one step at full size needs.

One sequence of `max_num_batched_tokens` prompt tokens runs through the model on a
ScratchRunner: its KV in a scratch pool and every routed expert read from one loading-buffer
slot (activation
memory does not depend on which weights a token meets), then the logits of `max_num_seqs`
rows. The peak allocated above what existed before the forward — the scratch pool and slot
excluded, since they stand in for the engine's own pages — is the activation reserve.
CUDA only: the CPU has no peak counter, so there the engine uses `estimate_activation_bytes`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from rimuru.dataplane.engine.forward.block_table_store import DeviceBlockTables
from rimuru.dataplane.engine.forward.paged_attention import (
    PagedAttention,
    PagedAttentionMeta,
    SequenceSlice,
)
from rimuru.dataplane.memory.geometry import PageGeometry
from rimuru.dataplane.memory.pool import UnifiedPool
from rimuru.dataplane.memory.tables import BlockTable, buffer_slot_id
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

    @contextlib.contextmanager
    def counting_rows(self, rows: torch.Tensor) -> Iterator[None]:
        """As MoEBackend.counting_rows (the graphs call it); nothing is counted here."""
        yield

    def reset_routing_counts(self) -> None:
        """Nothing to reset: this backend counts no routing (the graphs call it after capture)."""

    def moe(self, layer, x, topk_ids, topk_weights):
        return self.moe_kernel(x, topk_ids, topk_weights, self.buffer, self.buffer, self.table)


@dataclass(frozen=True)
class ScratchSeq:
    """One sequence of a scratch batch: new tokens after already cached ones."""

    num_new_tokens: int
    num_computed_tokens: int


SCRATCH_BLOCKS = 4  # KV pages per layer in the scratch pool; block tables cycle over them


class ScratchRunner:
    """The model over a scratch KV pool of SCRATCH_BLOCKS pages per layer and one expert
    slot: runs a step of any batch shape without engine state, and leaves none. Block tables
    cycle over the scratch pages, so the values attention reads are meaningless; only the
    shapes, and the memory the forward allocates, are real. The pool is zeroed so that
    context nobody wrote reads as 0, never as NaN that could reach the router."""

    def __init__(
        self,
        model: MoETransformer,
        host_experts: list[ExpertWeights],
        geometry: PageGeometry,
        moe_kernel,
        attention_kernels,
    ):
        self.model, self.geometry = model, geometry
        layers = model.config.num_layers
        kv_per_huge = geometry.huge_page_bytes // geometry.kv_page_bytes
        pool = UnifiedPool(
            geometry, math.ceil(layers * SCRATCH_BLOCKS / kv_per_huge), model.dtype, model.device,
            expert_dtype=model.config.expert_dtype,
        )  # fmt: skip
        pool.buffer.zero_()
        experts = OneSlotExperts(host_experts[0], moe_kernel, model.device)
        self.runner = model.with_backends(PagedAttention(pool, kernels=attention_kernels), experts)

    def prepare(
        self, batch: tuple[ScratchSeq, ...], logits_rows: int | None = None
    ) -> Callable[[], torch.Tensor]:
        """Put the batch's inputs on the device and return its forward, which returns the
        logits of each sequence's last token, or of the last `logits_rows` tokens. Apart, so
        that a measurement of the forward counts only what the forward allocates."""
        ids, pos, meta, slices = self._inputs(batch)
        start = slices[-1].start + slices[-1].num_new_tokens
        device = self.model.device
        if logits_rows is None:
            rows = torch.tensor([s.start + s.num_new_tokens - 1 for s in slices], device=device)
        else:
            rows = torch.arange(start - min(logits_rows, start), start, device=device)
        runner = self.runner

        def forward() -> torch.Tensor:
            return runner.compute_logits(runner.forward(ids, pos, meta)[rows])

        return forward

    def prepare_hidden(
        self, batch: tuple[ScratchSeq, ...], max_seq_len: int | None = None
    ) -> Callable[[], torch.Tensor]:
        """As `prepare`, but the forward stops at the final hidden states (a decode graph's
        output; the logits run outside it). max_seq_len: the bound the kernels size their
        launch by (a decode graph's is its max context, not the batch's longest)."""
        ids, pos, meta, _ = self._inputs(batch)
        if max_seq_len is not None:
            meta = dataclasses.replace(meta, max_seq_len=max(max_seq_len, meta.max_seq_len))
        runner = self.runner
        return lambda: runner.forward(ids, pos, meta)

    def _inputs(self, batch: tuple[ScratchSeq, ...]):
        device, layers = self.model.device, self.model.config.num_layers
        bs = self.geometry.shape.block_size
        slices, start, positions = [], 0, []
        for s in batch:
            context = s.num_computed_tokens + s.num_new_tokens
            table = BlockTable(layers)
            for block in range(math.ceil(context / bs)):
                table.append_block([(block % SCRATCH_BLOCKS) * layers + i for i in range(layers)])
            slices.append(SequenceSlice(start, s.num_new_tokens, s.num_computed_tokens, table))
            positions.append(np.arange(s.num_computed_tokens, context))
            start += s.num_new_tokens
        widest = max(len(s.table) for s in slices)
        meta = PagedAttentionMeta.build(
            slices, DeviceBlockTables(layers, len(slices), widest, bs, device)
        )
        pos = torch.from_numpy(np.concatenate(positions)).to(device)
        ids = pos % self.model.config.vocab_size
        return ids, pos, meta, slices


def prepare_profiling_forward(
    model: MoETransformer,
    host_experts: list[ExpertWeights],
    geometry: PageGeometry,
    num_tokens: int,
    num_seqs: int,
    moe_kernel,
    attention_kernels,
) -> Callable[[], torch.Tensor]:
    """The full-size step (module doc): one prompt of num_tokens, logits [min(S, T), V]."""
    scratch = ScratchRunner(model, host_experts, geometry, moe_kernel, attention_kernels)
    return scratch.prepare((ScratchSeq(num_tokens, 0),), logits_rows=num_seqs)


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
