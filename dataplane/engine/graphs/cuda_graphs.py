"""CUDA graphs of decode steps: one graph per padded batch size, replayed in place of the
~50 kernel launches per layer that the eager forward issues from Python (vLLM's capture
sizes; `enforce_eager` turns them off, as vLLM's `--enforce-eager` does).

A step runs as a graph when all of this holds, else eagerly as before:
  - every scheduled sequence decodes one token (no prompt chunk in the step);
  - there are at most max(capture sizes) of them, each with a context of at most
    `max_context` tokens (vLLM's max_seq_len_to_capture);
  - every expert of every layer is resident: the MoE then reads pool pages through the
    device expert table and never synchronises with the host. A layer with offloaded experts
    needs the host-driven copy path, which a graph cannot hold, unless the engine copies
    experts in on the device (expert_copy="device", device_copy.py): then any residency.

Invariants the replay relies on:
  - Inputs live in static buffers rewritten in place before each replay. Every address
    baked into a graph stays valid: the pool and its views are fixed at start-up and the
    expert table's device copy is rewritten in place (ExpertPageTable.on_device). The block
    tables and slot mapping are filled by device ops from the engine's block-table store
    (block_table_store.py): the host sends only the step's new blocks and [S] vectors.
  - Padding rows (the batch padded up to a capture size) write no KV (slot -1) and attend
    over one reserved, zeroed KV page per layer with a context of 1, so they read zeros,
    never NaN. MoEBackend.counting_rows keeps them out of the routing statistics.
  - The graphs' memory is planned before the pool: `graph_memory_bytes` captures the
    largest graph once on the profiling scratch and the engine adds it to its reserve, only
    when the policy starts with every expert resident beside it (else no graph is captured).
    Besides torch's pool, the driver keeps memory for every instantiated graph, which
    `memory_reserved` does not see (~100 KiB per graph per layer, beyond a plan of
    torch's bytes alone): the plan prices it per graph and layer
    (`decode_driver_bytes`).
  - Padding pages are KV pages no request may use: max_kv_tokens leaves them out.
  - A hybrid model's decode step also reads each sequence's SSM and conv pages through two
    static [G, n] tables of page ids; padding rows have page -1, which the state kernels
    neither read nor write. A sequence at its first token (a one-token prompt) runs
    eagerly: its pages must be zeroed first (paged_states.py).

Known difference from an eager step: the decode kernel sizes its flash-decoding splits from
the batch and the longest context. A graph is launched with its padded size and
`max_context`, so on contexts above ~256 tokens it may split differently from the eager
step of the same batch: same math, other float rounding. It can also use fewer, longer
splits at medium batches. The GPU check (bench/gpu_checks.py) requires identical tokens,
graphs against eager, at short contexts (< 100 tokens); it does not cover long contexts.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch

from rimuru.dataplane.engine.forward.block_table_store import DeviceBlockTables
from rimuru.dataplane.engine.forward.in_flight import TokenFill
from rimuru.dataplane.engine.forward.paged_attention import PagedAttentionMeta, SequenceSlice
from rimuru.dataplane.engine.forward.paged_states import HybridStepMeta, StateMeta, StepPart
from rimuru.dataplane.engine.forward.pinned_upload import to_device
from rimuru.dataplane.engine.forward.profile_run import ScratchRunner, ScratchSeq
from rimuru.dataplane.memory.allocator import PageAllocator
from rimuru.dataplane.memory.geometry import PageType
from rimuru.dataplane.memory.pool import UnifiedPool
from rimuru.dataplane.memory.tables import StatePages
from rimuru.dataplane.model import MoETransformer

log = logging.getLogger(__name__)

Graphs = TypeVar("Graphs")  # DecodeGraphs or PiecewiseGraphs: capture() and a cost

GRAPH_PADDING = "cuda-graph padding"  # owner of the padding rows' KV pages (one per layer)


@dataclass(frozen=True)
class CaptureCost:
    """What capturing a set of graphs took: seconds, the bytes torch's allocator holds for
    them (static inputs and pool), and how far the device's free memory fell, which also
    counts what the driver keeps per instantiated graph."""

    seconds: float = 0.0
    held_bytes: int = 0
    free_drop_bytes: int = 0


def capture_measured(device: torch.device, make: Callable[[], Graphs]) -> Graphs:
    """Make a set of graphs (static inputs), capture them, and record what that took as
    their `cost`. Garbage is collected and the allocator's cache emptied first: an engine
    dropped earlier in the process, collected mid-capture, moved these figures by gigabytes
    (seen in the GPU checks). Raises what capture raises."""
    gc.collect()
    torch.cuda.empty_cache()
    held, free = torch.cuda.memory_reserved(device), torch.cuda.mem_get_info(device)[0]
    t0 = time.perf_counter()
    graphs = make()
    graphs.capture()
    graphs.cost = CaptureCost(
        time.perf_counter() - t0,
        torch.cuda.memory_reserved(device) - held,
        free - torch.cuda.mem_get_info(device)[0],
    )
    return graphs


def capture_sizes(max_num_seqs: int) -> tuple[int, ...]:
    """vLLM's pattern: 1, 2, 4, then every multiple of 8, up to max_num_seqs (included)."""
    sizes = {1, 2, 4, *range(8, max_num_seqs + 1, 8), max_num_seqs}
    return tuple(sorted(s for s in sizes if s <= max_num_seqs))


# The driver keeps memory for every instantiated graph, outside torch's allocator
# (`memory_reserved` does not see it); it grows with the layers a graph holds. The constant
# below must stay above what a GPU shows as the fall in free memory beyond torch's bytes per
# layer per decode graph. Measuring it in the plan's own capture was tried and dropped: a
# process's first capture carries one-off costs (priced per graph, it planned ~6x what was
# used), and a second engine in the same process then planned otherwise. So the plan prices it
# per layer, with margin; the engine logs what capture took against the plan (planned ... fell
# by ...).
DRIVER_BYTES_PER_GRAPH_LAYER = 128 * 1024


def decode_driver_bytes(num_graphs: int, num_layers: int) -> int:
    """The driver's memory the plan sets aside for `num_graphs` decode graphs."""
    return num_graphs * num_layers * DRIVER_BYTES_PER_GRAPH_LAYER


def graph_memory_bytes(scratch: ScratchRunner, size: int, block_size: int, max_context: int) -> int:
    """Device memory one decode graph of `size` sequences keeps: its private pool, measured
    by capturing it on the profiling scratch (same kernels, same shapes), then released."""
    device = scratch.model.device
    forward = scratch.prepare_hidden((ScratchSeq(1, block_size - 1),) * size, max_context)
    forward()  # eager first: anything lazy (allocator blocks, kernel loads) happens here
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    before = torch.cuda.memory_reserved(device)
    graph = torch.cuda.CUDAGraph()
    # a stream of this device: torch's default capture stream lives on whichever device
    # captured first in the process (a second engine on another GPU would capture there)
    with torch.cuda.graph(graph, stream=torch.cuda.Stream(device)):
        out = forward()
    torch.cuda.synchronize(device)
    used = torch.cuda.memory_reserved(device) - before
    del graph, out
    torch.cuda.empty_cache()
    return int(used)


class DecodeGraphs:
    """Static decode inputs and the graphs captured over them (module doc).

    `replay=False` runs the same static, padded inputs eagerly: the CPU tests check the
    padding and buffer handling with it, since a CPU cannot capture."""

    def __init__(
        self,
        model: MoETransformer,
        experts,  # MoEBackend: counting_rows, graph_safe, refresh_device_tables
        pad_pages: Sequence[int],  # one reserved, zeroed KV page per layer
        sizes: Sequence[int],
        max_context: int,
        block_size: int,
        *,
        replay: bool = True,
    ):
        self.model, self.experts = model, experts
        self.sizes = tuple(sorted(sizes))
        self.max_context, self.block_size = max_context, block_size
        self.replay = replay
        layers, n, device = model.config.num_kv_layers, self.sizes[-1], model.device
        self.width = -(-max_context // block_size)  # block-table columns
        self.pad_pages = list(pad_pages)  # owned by GRAPH_PADDING while the graphs live
        self._pad = torch.tensor(pad_pages, dtype=torch.int32, device=device)  # [L]
        # device buffers, rewritten in place per step, by device ops from the block-table
        # store and one upload of the step's vectors (`run`)
        self.ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.pos = torch.zeros(n, dtype=torch.int64, device=device)
        self.slots = torch.full((layers, n), -1, dtype=torch.int64, device=device)
        self.tables = self._pad[:, None, None].repeat(1, n, self.width)  # [L, n, W]
        self.seq_lens = torch.ones(n, dtype=torch.int32, device=device)
        self.rows = torch.zeros(n, dtype=torch.int64, device=device)  # 1 = a real row
        self.cu = torch.arange(n + 1, dtype=torch.int32, device=device)  # one query each
        num_gdn = len(model.config.linear_attention_layers)  # hybrid: the state pages
        self.ssm_pages = torch.full((num_gdn, n), -1, dtype=torch.int64, device=device)
        self.conv_pages = torch.full((num_gdn, n), -1, dtype=torch.int64, device=device)
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph | None, torch.Tensor | None]] = {}
        self.cost = CaptureCost()  # once captured
        self.steps = 0  # steps served from the static inputs
        self.replays = 0  # of which replayed as graphs

    def size_for(self, num_seqs: int) -> int | None:
        return next((s for s in self.sizes if s >= num_seqs), None)

    def serves(self, slices: Sequence[SequenceSlice]) -> bool:
        hybrid = self.model.config.is_hybrid
        return (
            self.size_for(len(slices)) is not None
            and all(
                s.num_new_tokens == 1
                and s.context_len <= self.max_context
                and len(s.table) <= self.width
                and not (hybrid and s.num_computed_tokens == 0)
                for s in slices
            )
            and self.experts.graph_safe()
        )

    def _meta(self, size: int):
        attention = PagedAttentionMeta(
            (), self.slots[:, :size], self.tables[:, :size], self.cu[: size + 1],
            self.seq_lens[:size], 1, self.max_context,
        )  # fmt: skip
        if not self.model.config.is_hybrid:
            return attention
        ssm, conv, cu = self.ssm_pages[:, :size], self.conv_pages[:, :size], self.cu[: size + 1]
        states = StateMeta(
            tuple(range(size)), (1,) * size, ssm, conv, cu, ssm.new_empty(0), 0,
            decode=StepPart(None, ssm, conv, cu), prefill=None,
        )  # fmt: skip
        return HybridStepMeta(attention, states)

    def _forward(self, size: int) -> torch.Tensor:
        with self.experts.counting_rows(self.rows[:size]):
            return self.model.forward(self.ids[:size], self.pos[:size], self._meta(size))

    def capture(self) -> None:
        """One graph per size, largest first, all in one memory pool (smaller graphs reuse
        the largest one's blocks). Inputs are all padding while capturing."""
        device = self.model.device
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(device)  # this device's (see graph_memory_bytes)
        for size in reversed(self.sizes):
            self._forward(size)  # eager: kernels loaded, allocator warm
            torch.cuda.synchronize(device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=stream):
                out = self._forward(size)
            self._graphs[size] = (graph, out)
        torch.cuda.synchronize(device)
        self.experts.reset_routing_counts()  # capture routed padding only; keep no trace

    def run(
        self,
        input_ids: list[int],
        positions: list[int],
        slices: list[SequenceSlice],
        tables: DeviceBlockTables,
        state_pages: Sequence[StatePages] = (),
        fill: TokenFill | None = None,
    ):
        """The step's hidden states [len(slices), D] (the caller checked `serves`); `tables`:
        the engine's block-table store; `state_pages`: a hybrid model's, one per slice;
        `fill`: tokens of pending rows, taken on the device (async scheduling)."""
        n, size = len(slices), self.size_for(len(slices))
        assert size is not None
        host = np.zeros((4, size), dtype=np.int32)  # padding rows: 0 everywhere
        host[0, :n] = input_ids
        host[1, :n] = positions
        host[2, :n] = 1  # a real row: counted in the routing statistics
        host[3, :n] = tables.assign([s.table for s in slices])  # each sequence's store row
        ids, pos, real, rows = tables.upload(host.ravel()).view(4, size).long()
        # a padding row's position is 0: its context is 1
        for dst, src in ((self.ids, ids), (self.pos, pos), (self.rows, real),
                         (self.seq_lens, pos + 1)):  # fmt: skip
            dst[:size].copy_(src)
        if fill is not None:
            fill.apply(self.ids)
        # Real rows: their blocks, gathered from the store; padding rows: the pad page in
        # column 0 (their context is 1). Past that, columns keep what an earlier step left:
        # no kernel reads past a sequence's length.
        widest = max(len(s.table) for s in slices)
        self.tables[:, :n, :widest].copy_(tables.gather_tables(rows[:n], widest))
        self.tables[:, n:size, 0].copy_(self._pad[:, None].expand(-1, size - n))
        self.slots[:, :n].copy_(tables.slot_mapping(rows[:n], pos[:n]))
        self.slots[:, n:size].fill_(-1)  # padding writes no KV
        if state_pages:
            pages = np.full((2, self.ssm_pages.shape[0], size), -1, dtype=np.int64)
            pages[0, :, :n] = np.asarray([p.ssm for p in state_pages]).T
            pages[1, :, :n] = np.asarray([p.conv for p in state_pages]).T
            staged = to_device(torch.from_numpy(pages), self.ssm_pages.device)  # not pageable
            self.ssm_pages[:, :size].copy_(staged[0])
            self.conv_pages[:, :size].copy_(staged[1])
        # The graphs read the expert tables at fixed addresses; only an eager MoE call
        # refreshes them, so after the adjuster moved experts they are refreshed here.
        self.experts.refresh_device_tables()
        self.steps += 1
        graph, out = self._graphs.get(size, (None, None))
        if self.replay and graph is not None:
            graph.replay()
            self.replays += 1
        else:
            out = self._forward(size)
        return out[:n]


def build_decode_graphs(
    model: MoETransformer,
    experts,  # MoEBackend
    allocator: PageAllocator,
    pool: UnifiedPool,
    sizes: Sequence[int],
    max_context: int,
    block_size: int,
    *,
    capture: bool = True,
    planned_bytes: int = 0,
) -> DecodeGraphs | None:
    """The decode graphs over the engine's pool: padding pages reserved and zeroed, static
    inputs made, one graph per size captured. None (every step eager) when experts are
    offloaded at start-up without device copy-in, when no KV page is left for the padding,
    or when capture fails. capture=False keeps the static, padded inputs but runs them
    eagerly (what a CPU can test)."""
    if not experts.graph_safe():
        log.info("CUDA graphs: not captured, experts are offloaded at start-up")
        return None
    pad = allocator.allocate(PageType.KV, model.config.num_kv_layers, GRAPH_PADDING)
    if pad is None:
        log.info("CUDA graphs: not captured, no KV pages left for the padding rows")
        return None
    pool.view(PageType.KV)[pad] = 0  # padding rows attend over zeros
    if not capture:
        return DecodeGraphs(model, experts, pad, sizes, max_context, block_size, replay=False)
    try:
        graphs = capture_measured(
            model.device,
            lambda: DecodeGraphs(model, experts, pad, sizes, max_context, block_size),
        )
    except Exception:  # serving eagerly beats not serving; the log says why
        log.exception("CUDA graphs: capture failed, every step runs eagerly")
        allocator.free(PageType.KV, pad, GRAPH_PADDING)
        return None
    cost = graphs.cost
    log.info(
        "CUDA graphs: %d decode sizes (1..%d seqs, contexts <= %d) captured in %.1f s, "
        "%.1f MiB held (planned %.1f MiB); device free memory fell by %.1f MiB",
        len(graphs.sizes), graphs.sizes[-1], graphs.max_context, cost.seconds,
        cost.held_bytes / 2**20, planned_bytes / 2**20, cost.free_drop_bytes / 2**20,
    )  # fmt: skip
    return graphs
