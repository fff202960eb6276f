"""The MoE layer the model calls (its ExpertBackend): each layer's routing counted, its
non-resident routed experts fetched by the copy-in (copy_in.py), then the MoE computed from
wherever the weights lie: the Triton kernel through a page table, or the torch reference.

What must stay true: the MoE math is the same wherever the weights lie (experts are
accumulated in expert id order on the torch path), so a memory policy never changes the
tokens.

Shape key: T = tokens, D = hidden, I = expert intermediate, E = experts, K = top-k.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F

from rimuru.dataplane.engine.experts.copy_in import CopyIn
from rimuru.dataplane.engine.experts.residency_table import ResidencyTable
from rimuru.dataplane.engine.experts.routing_histogram import (
    RoutingHistogram,
    routing_histogram_torch,
)
from rimuru.dataplane.memory.geometry import PageType
from rimuru.dataplane.model.block_fp8 import dequantize

MoEKernel = Callable[..., torch.Tensor]


class MoEBackend:
    def __init__(
        self,
        residency: ResidencyTable,
        copy_in: CopyIn,
        moe_kernel: MoEKernel | None = None,
        histogram: RoutingHistogram = routing_histogram_torch,
    ):
        """residency: read (where resident experts lie); copy_in: fetches the others.
        moe_kernel: None = the torch reference. histogram: each layer's tokens per expert
        (routing_histogram.py; kernels.routing_histogram on CUDA, one launch)."""
        self.residency = residency
        self.copy_in = copy_in
        self.moe_kernel = moe_kernel
        self.histogram = histogram
        self.num_experts, self.inter, self.hidden = residency.host[0].w1.shape
        self._pages = residency.pool.view(PageType.EXPERT)
        # Block-FP8 experts: every expert's scales [E, ...] per layer and matrix, on the
        # device beside the pool, never moved (memory/geometry.py says why); None otherwise.
        self._scales = None
        if residency.host[0].is_fp8:
            self._scales = [
                tuple(s.to(residency.device) for s in (w.w1_scale, w.w3_scale, w.w2_scale))
                for w in residency.host
            ]
        # tokens routed to each expert since the last reset: the online-hotness signal. Kept
        # on the device so a layer whose experts are all resident needs no host sync.
        self._routing_counts = torch.zeros(
            residency.num_layers, self.num_experts, dtype=torch.int64, device=residency.device
        )
        self._count_rows: torch.Tensor | None = None  # counting_rows says what it is

    @contextlib.contextmanager
    def counting_rows(self, rows: torch.Tensor) -> Iterator[None]:
        """Count only `rows` ([T] int64 of 1/0) of the batches run inside: a batch padded up
        to a CUDA graph's size (cuda_graphs.py, piecewise_graphs.py) marks its real rows, so
        that padding rows neither count in the hotness statistics nor make an expert
        "needed". A captured graph keeps reading `rows` at replay."""
        self._count_rows = rows
        try:
            yield
        finally:
            self._count_rows = None

    def moe(
        self, layer: int, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor
    ) -> torch.Tensor:
        # [E]; this step's counts are added to the layer's running total in the same call
        counts = self.histogram(
            topk_ids, self.num_experts, self._count_rows, self._routing_counts[layer]
        )
        needed = self.copy_in.fetch(
            layer, x, counts, self._count_rows, host_routed=self.moe_kernel is None
        )
        if self.moe_kernel is not None:
            return self.moe_kernel(
                x, topk_ids, topk_weights, self._pages, self.copy_in.buffer(layer),
                self.copy_in.kernel_table(layer),
            )  # fmt: skip
        return self._moe_torch(layer, x, topk_ids, topk_weights, needed)

    def graph_safe(self) -> bool:
        """Whether a step can be a CUDA graph now: device copy-in always; host copies only
        while every expert is resident (no copy to decide)."""
        return self.copy_in.graph_safe()

    def refresh_device_tables(self) -> None:
        """Before a replay: every table a captured MoE reads, up to date in place."""
        self.residency.refresh_device_tables()

    @property
    def routing_counts(self) -> torch.Tensor:
        """[L, E] int64 on the host: tokens routed to each expert since the last reset."""
        return self._routing_counts.cpu()

    def reset_routing_counts(self) -> None:
        self._routing_counts.zero_()

    def _weights(self, layer: int, expert: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """Expert `expert`'s (w1, w3, w2) from its pages or loading rows, in `dtype` (block
        FP8 dequantized with its scales)."""
        pages = self.residency.table.pages(layer, expert)
        if pages is not None:
            source, ids = self._pages, pages
        else:
            source, ids = self.copy_in.rows_of(layer, expert)
        w1 = source[ids[0]].view(self.inter, self.hidden)  # [I, D]
        w3 = source[ids[1]].view(self.inter, self.hidden)  # [I, D]
        w2 = source[ids[2]].view(self.hidden, self.inter)  # [D, I]
        if self._scales is None:
            return w1, w3, w2
        scales = (s[expert] for s in self._scales[layer])
        return tuple(dequantize(w, s, dtype) for w, s in zip((w1, w3, w2), scales, strict=True))

    def _moe_torch(self, layer, x, topk_ids, topk_weights, needed) -> torch.Tensor:
        out = torch.zeros_like(x)  # [T, D]
        for e in needed:  # ascending expert id, whatever the residency
            tokens, slots = torch.nonzero(topk_ids == e, as_tuple=True)
            w1, w3, w2 = self._weights(layer, e, x.dtype)
            xe = x[tokens]  # [n, D]
            h = F.silu(F.linear(xe, w1)) * F.linear(xe, w3)  # [n, I]
            ye = F.linear(h, w2) * topk_weights[tokens, slots, None]  # [n, D]
            out.index_add_(0, tokens, ye.to(x.dtype))
        return out
