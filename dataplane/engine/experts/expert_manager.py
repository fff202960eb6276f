"""Expert manager: where every routed expert lives, and the MoE layer computed from there.

Residency per (layer, expert): in three pool expert pages (w1, w3, w2), or on the host
(the backing store: every expert's matrices, pinned on CUDA). Device copy-in (the default,
device_copy.py) copies a routed non-resident expert into a loading slot: three pool pages
held only while some layer has that many experts offloaded. Host copies use two loading
buffers outside the pool, alternated by layer, that hold copies of non-resident experts for
one step: while layer l
computes from buffer l % 2, the experts predicted for layer l + 1 (layer l+1's router
applied to layer l's MoE input, the cross-layer prediction of pre-gating systems) are
copied into buffer (l + 1) % 2. Experts that were not predicted are copied before the
layer computes.

Layers here are MoE layers (ModelConfig.moe_layers): a dense layer has no experts, so layer l
is the l-th MoE layer and the prediction for "layer l + 1" uses the next MoE layer's router.

Ordering rules that must stay true:
  * a page table row points at pool pages only after the copy into them completed;
  * an evicted expert's pages are released through deferred reclaim, never reused while
    a forward that may read them is in flight (or handed to a new loading slot, which the
    next forward writes before any read);
  * the MoE math is the same wherever the weights lie (experts are accumulated in expert
    id order on the torch path), so a memory policy never changes the tokens.

Shape key: T = tokens, D = hidden, I = expert intermediate, E = experts, K = top-k,
S = loading-buffer slots (experts) per buffer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from rimuru.dataplane.adjust.adjuster import ChangeList
from rimuru.dataplane.engine.experts.device_copy import DeviceCopyIn
from rimuru.dataplane.engine.experts.routing_histogram import (
    RoutingHistogram,
    routing_histogram_torch,
)
from rimuru.dataplane.memory.allocator import PageAllocator
from rimuru.dataplane.memory.geometry import PageType
from rimuru.dataplane.memory.pool import UnifiedPool
from rimuru.dataplane.memory.reclaim import DeferredReclaim
from rimuru.dataplane.memory.tables import ExpertPageTable, buffer_slot_id
from rimuru.dataplane.model.weights import ExpertWeights

MoEKernel = Callable[..., torch.Tensor]


@dataclass
class ExpertCounters:
    evictions: int = 0
    loads: int = 0  # experts brought back into pool pages by the adjuster
    buffer_copies: int = 0  # experts copied into a loading buffer for one step
    bytes_h2d: int = 0
    predictor_hits: int = 0  # non-resident experts needed and already prefetched
    predictor_needed: int = 0  # non-resident experts needed


@dataclass
class _Buffer:
    """One loading buffer: S slots of three expert matrices each."""

    pages: torch.Tensor  # [3S, I*D]
    layer: int = -1
    slot_of: dict[int, int] = field(default_factory=dict)  # expert -> slot
    used: set[int] = field(default_factory=set)
    ready: object = None  # CUDA event: the prefetch copies into this buffer are done

    def reset(self, layer: int) -> None:
        self.layer, self.slot_of, self.used, self.ready = layer, {}, set(), None


class ExpertManager:
    def __init__(
        self,
        pool: UnifiedPool,
        allocator: PageAllocator,
        reclaim: DeferredReclaim,
        host_experts: Sequence[ExpertWeights],
        num_buffer_slots: int,
        router_logits: Callable[[int, torch.Tensor], torch.Tensor] | None = None,
        top_k: int = 1,
        moe_kernel: MoEKernel | None = None,
        copy_kernel: Callable[..., None] | None = None,
        histogram: RoutingHistogram = routing_histogram_torch,
        num_buffers: int = 2,
        own_slots: bool = True,
    ):
        """copy_kernel: None = host-driven copies (this module's doc); else device-decided
        copy-in (device_copy.py) through this function (kernels.copy_routed_experts, or
        device_copy.copy_routed_experts_torch on the CPU). own_slots: the loading slots'
        pages are taken from and given back to `allocator` here; False on a tensor-parallel
        follower, which is handed rank 0's (DeviceCopyIn.set_slots). histogram: each layer's
        tokens per expert (routing_histogram.py; kernels.routing_histogram on CUDA, one
        launch)."""
        self.pool = pool
        self.allocator = allocator
        self.reclaim = reclaim
        self.host = list(host_experts)
        self.num_layers = len(self.host)
        self.num_experts, self.inter, self.hidden = self.host[0].w1.shape
        self.device = pool.device
        self.table = ExpertPageTable(self.num_layers, self.num_experts, self.device)
        self.resident: list[set[int]] = [set() for _ in range(self.num_layers)]
        self.residency_version = 0  # bumped whenever `resident` changes (caches key on it)
        self._sets: list[frozenset[int]] = []
        self._sets_version = -1  # the residency_version _sets was built at
        self.num_buffer_slots = max(1, num_buffer_slots)
        self.own_slots = own_slots
        page_elems = self.inter * self.hidden
        # Device copy-in copies into pool pages: its one buffer is never read (the MoE
        # kernel's argument), so it holds a single slot.
        buffer_rows = 3 * (1 if copy_kernel is not None else self.num_buffer_slots)
        self.buffers = [
            _Buffer(torch.empty(buffer_rows, page_elems, dtype=pool.dtype, device=self.device))
            for _ in range(num_buffers)
        ]
        self.router_logits = router_logits
        self.top_k = top_k
        self.moe_kernel = moe_kernel
        self.histogram = histogram
        self.counters = ExpertCounters()
        # tokens routed to each expert since the last reset: the online-hotness signal. Kept
        # on the device so a layer whose experts are all resident needs no host sync.
        self._routing_counts = torch.zeros(
            self.num_layers, self.num_experts, dtype=torch.int64, device=self.device
        )
        self._copy_stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        # Rows of the step's batch to count, [T] int64 of 1/0, or None for all: a decode
        # batch padded up to a CUDA graph's size (cuda_graphs.py) sets it so that padding
        # rows neither count in the hotness statistics nor make an expert "needed".
        self.count_rows: torch.Tensor | None = None
        self.copy_kernel = copy_kernel
        self.device_copy = (
            DeviceCopyIn(self.table, self.resident, self.num_buffer_slots, self.device)
            if copy_kernel is not None
            else None
        )
        # device mode: experts copied in, counted on the device, read once per step
        self._device_copies = torch.zeros(1, dtype=torch.int32, device=self.device)

    # ------------------------------------------------------------------ residency
    @property
    def buffer_bytes(self) -> int:
        return sum(b.pages.numel() * b.pages.element_size() for b in self.buffers)

    def num_resident(self) -> int:
        return sum(len(r) for r in self.resident)

    def resident_sets(self) -> list[frozenset[int]]:
        """Frozen per layer; the adjuster asks every round, so rebuilt only when the
        residency changed (building a set per layer every round costs the host as much as
        a fair share of a decode step at real models' sizes)."""
        if self._sets_version != self.residency_version:
            self._sets = [frozenset(r) for r in self.resident]
            self._sets_version = self.residency_version
        return self._sets

    def place(self, layer: int, expert: int, pages: tuple[int, ...]) -> None:
        """Copy an expert into reserved pool pages, then point its table row at them."""
        w1, w3, w2 = self.host[layer].expert(expert)
        view = self.pool.view(PageType.EXPERT)
        stream = self._copy_stream
        if stream is not None:
            # The pages may have been released in stream order (async scheduling): the
            # forward queued before may still read them, so the copy waits for it.
            stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            for page, matrix in zip(pages, (w1, w3, w2), strict=True):
                view[page].copy_(matrix.reshape(-1), non_blocking=stream is not None)
        if stream is not None:
            # The forward runs on the current stream: it must see the finished copy before
            # the table row can point at these pages.
            torch.cuda.current_stream(self.device).wait_stream(stream)
        self.counters.bytes_h2d += self._matrix_bytes(w1) * 3
        self.table.set_pages(layer, expert, tuple(pages))
        self.resident[layer].add(expert)
        self.residency_version += 1
        if self.device_copy is not None:
            self.device_copy.mark_stale(layer)
            self._free_unused_slots()

    def evict(self, layer: int, expert: int, last_step: int) -> None:
        if self.device_copy is not None and expert in self.resident[layer]:
            self.device_copy.check_evict(layer)  # the expert stays resident, nothing leaks
        self._drop(layer, expert, last_step)

    def _drop(self, layer: int, expert: int, last_step: int) -> None:
        pages = self.table.pages(layer, expert)
        if pages is None or expert not in self.resident[layer]:
            raise ValueError(f"expert {expert} of layer {layer} is not resident")
        self.table.clear(layer, expert)
        self.resident[layer].discard(expert)
        self.residency_version += 1
        owner = ("expert", layer, expert)
        dc = self.device_copy
        if dc is not None:
            dc.mark_stale(layer)
            if self.own_slots and len(dc.slots) < dc.slots_needed():
                # The layer now offloads more experts than there are slots: this expert's
                # pages become the new slot (no forward reads them as the expert's again,
                # and the next one that reads the slot writes it first).
                self.allocator.transfer(PageType.EXPERT, pages, owner, _slot_owner(len(dc.slots)))
                dc.add_slot(pages)
                pages = ()
        self.reclaim.release(PageType.EXPERT, pages, owner, last_step)
        self.counters.evictions += 1

    def _free_unused_slots(self) -> None:
        """Slots no layer needs any more go back to the pool."""
        self._release_slots_beyond(self.device_copy.slots_needed())

    def _release_slots_beyond(self, keep: int) -> None:
        """The last slots past `keep` back to the pool (after the last forward that may have
        read them: they were read only by forwards before this call)."""
        dc = self.device_copy
        while self.own_slots and len(dc.slots) > keep:
            slot = len(dc.slots) - 1
            self.reclaim.release(
                PageType.EXPERT, dc.pop_slot(), _slot_owner(slot), self.reclaim.last_completed_step
            )

    def _take_slots(self) -> None:
        """Slots for the residency set at start-up, from the pool's free pages."""
        dc = self.device_copy
        while self.own_slots and len(dc.slots) < dc.slots_needed():
            slot = len(dc.slots)
            pages = self.allocator.allocate(PageType.EXPERT, 3, _slot_owner(slot))
            if pages is None:
                raise ValueError(
                    f"the pool cannot hold loading slot {slot} (three expert pages) beside the "
                    f"experts this policy keeps resident: raise the memory budget"
                )
            dc.add_slot(tuple(pages))

    def apply(self, changes: ChangeList, last_step: int) -> None:
        """Evictions first (their pages free after `last_step`), then the reserved loads."""
        for layer, expert in changes.evict:
            self.evict(layer, expert, last_step)
        for load in changes.load:
            self.place(load.layer, load.expert, load.pages)
            self.counters.loads += 1

    def load_initial(self, experts: Sequence[tuple[int, int]], pages_per_expert: int) -> None:
        """Start-up residency; raises if the pool cannot hold them."""
        for layer, expert in experts:
            pages = self.allocator.allocate(
                PageType.EXPERT, pages_per_expert, ("expert", layer, expert)
            )
            if pages is None:
                raise ValueError(
                    f"the pool ({self.pool.num_bytes} B) cannot hold the {len(experts)} experts "
                    f"this policy keeps resident: raise the memory budget or choose a policy that "
                    f"offloads experts (fixed/elastic)"
                )
            self.place(layer, expert, tuple(pages))
        if self.device_copy is not None:  # a residency past the slots fails here, not mid-step
            self._take_slots()
            self.device_copy.offloaded()

    def release_all(self) -> None:
        """Every expert off the device, only to re-choose residency: load_initial follows.
        Past the loading buffer's slots on purpose (evict() would refuse): device copy-in
        derives its rows only when next read, after load_initial."""
        for layer in range(self.num_layers):
            for expert in sorted(self.resident[layer]):
                self._drop(layer, expert, last_step=self.reclaim.last_completed_step)
        if self.device_copy is not None:  # load_initial takes them again
            self._release_slots_beyond(0)

    # ------------------------------------------------------------------ MoE (ExpertBackend)
    def begin_step(self) -> None:
        for b in self.buffers:
            b.reset(-1)

    def moe(
        self, layer: int, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor
    ) -> torch.Tensor:
        buffer = self.buffers[layer % len(self.buffers)]
        if buffer.layer != layer:
            buffer.reset(layer)
        # [E]; this step's counts are added to the layer's running total in the same call
        counts = self.histogram(
            topk_ids, self.num_experts, self.count_rows, self._routing_counts[layer]
        )
        if self.device_copy is not None:
            return self._moe_device_copy(layer, x, topk_ids, topk_weights, buffer, counts)
        if (
            self.moe_kernel is not None
            and self._all_resident(layer)
            and self._all_resident(layer + 1)
        ):
            # Nothing to copy for this layer and nothing to predict for the next: no host
            # synchronisation at all (the kernel reads every expert from its pages).
            return self._moe_kernel(layer, x, topk_ids, topk_weights, buffer)
        # One host synchronisation per layer: this layer's routing histogram and, when
        # predicting, the histogram of layer l+1's router applied to this layer's input.
        predict = self.router_logits is not None and layer + 1 < self.num_layers
        if predict:
            guess = torch.topk(self.router_logits(layer + 1, x), self.top_k, dim=-1).indices
            counts = torch.stack((counts, self.histogram(guess, self.num_experts, self.count_rows)))
        host = counts.cpu().view(-1, self.num_experts)  # [1 or 2, E]
        needed = torch.nonzero(host[0]).flatten().tolist()
        missing = [e for e in needed if e not in self.resident[layer]]
        if layer > 0:
            self.counters.predictor_needed += len(missing)
            self.counters.predictor_hits += sum(1 for e in missing if e in buffer.slot_of)
        if buffer.ready is not None:
            torch.cuda.current_stream(self.device).wait_event(buffer.ready)
        # all of them first: a full buffer may only drop predictions this layer does not need
        buffer.used.update(missing)
        for e in missing:
            if e not in buffer.slot_of:
                self._copy_to_buffer(buffer, layer, e)
        if missing and self._copy_stream is not None:
            # on-demand copies: this layer's MoE must see them
            torch.cuda.current_stream(self.device).wait_stream(self._copy_stream)
        if predict:
            self._prefetch(layer + 1, torch.nonzero(host[1]).flatten().tolist())
        if self.moe_kernel is not None:
            out = self._moe_kernel(layer, x, topk_ids, topk_weights, buffer)
        else:
            out = self._moe_torch(layer, x, topk_ids, topk_weights, buffer, needed)
        return out

    def fully_resident(self) -> bool:
        """Every expert of every layer lies in its pool pages (what a CUDA graph needs)."""
        return all(len(r) == self.num_experts for r in self.resident)

    def _all_resident(self, layer: int) -> bool:
        return layer >= self.num_layers or len(self.resident[layer]) == self.num_experts

    @property
    def routing_counts(self) -> torch.Tensor:
        """[L, E] int64 on the host: tokens routed to each expert since the last reset."""
        return self._routing_counts.cpu()

    def reset_routing_counts(self) -> None:
        self._routing_counts.zero_()

    def _prefetch(self, next_layer: int, predicted: list[int]) -> None:
        """Copy layer l+1's predicted non-resident experts into the other buffer while
        layer l computes. The copy stream first waits for the compute queued so far (the
        previous user of that buffer, layer l-1, must be done reading it); layer l+1
        waits for the copies' event before it computes."""
        buffer = self.buffers[next_layer % 2]
        buffer.reset(next_layer)
        if self._copy_stream is not None:
            self._copy_stream.wait_stream(torch.cuda.current_stream(self.device))
        for e in predicted:
            if e not in self.resident[next_layer] and len(buffer.slot_of) < self.num_buffer_slots:
                self._copy_to_buffer(buffer, next_layer, e)
        if self._copy_stream is not None and buffer.slot_of:
            buffer.ready = self._copy_stream.record_event()

    def _copy_to_buffer(self, buffer: _Buffer, layer: int, expert: int) -> None:
        if len(buffer.slot_of) >= self.num_buffer_slots:
            # Full of predictions: drop the ones this layer does not use.
            unused = [e for e in buffer.slot_of if e not in buffer.used]
            if not unused:
                raise RuntimeError(
                    f"layer {layer} needs more than {self.num_buffer_slots} non-resident experts "
                    f"in one step: the loading buffer is smaller than expert_offload_limit"
                )
            del buffer.slot_of[unused[0]]
        slot = min(set(range(self.num_buffer_slots)) - set(buffer.slot_of.values()))
        stream = self._copy_stream
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            for i, matrix in enumerate(self.host[layer].expert(expert)):
                buffer.pages[3 * slot + i].copy_(
                    matrix.reshape(-1), non_blocking=stream is not None
                )
        buffer.slot_of[expert] = slot
        self.counters.buffer_copies += 1
        self.counters.bytes_h2d += 3 * self._matrix_bytes(self.host[layer].w1[expert])

    def _moe_device_copy(self, layer, x, topk_ids, topk_weights, buffer, counts) -> torch.Tensor:
        """Device mode (device_copy.py): copy-in and MoE without a host decision."""
        offloaded = self.device_copy.offloaded()[layer]  # [S]
        w, pool = self.host[layer], self.pool.view(PageType.EXPERT)
        rows = self.device_copy.slot_rows()
        self.copy_kernel(counts, offloaded, w.w1, w.w3, w.w2, pool, rows, self._device_copies)
        if self.moe_kernel is not None:
            table = self.device_copy.table_on_device()[layer]
            return self.moe_kernel(x, topk_ids, topk_weights, pool, buffer.pages, table)
        needed = torch.nonzero(counts.cpu()).flatten().tolist()  # the CPU path
        return self._moe_torch(layer, x, topk_ids, topk_weights, buffer, needed)

    def device_counters(self) -> torch.Tensor | None:
        """Device mode: [1] int32, the experts copied in since the last `restart_device_count`,
        counted on the device (read with the step's sampled tokens, in one wait)."""
        return self._device_copies if self.device_copy is not None else None

    def add_device_copies(self, copies: int) -> None:
        """Count `copies`, read from `device_counters()` on the host (after
        `restart_device_count` was queued behind that read)."""
        self.counters.buffer_copies += copies
        self.counters.bytes_h2d += copies * 3 * self._matrix_bytes(self.host[0].w1[0])

    def restart_device_count(self) -> None:
        """Zero the device's count, queued behind the read of it: the kernels of the next
        step launched add after it."""
        self._device_copies.zero_()

    def sync_counters(self) -> None:
        """Device mode: add the copies counted on the device to the host counters (a wait
        on the device; the engine folds it into its read of the tokens instead)."""
        if self.device_copy is not None:
            self.add_device_copies(int(self._device_copies.item()))
            self.restart_device_count()

    def refresh_device_tables(self) -> None:
        """Bring every table a captured step reads up to date, in place (a replay runs no
        Python, so nothing inside it would): the page table and, in device mode, the
        copy-in rows. Stream-ordered after the adjuster's copies (place() waits for them)."""
        self.table.on_device()
        if self.device_copy is not None:
            self.device_copy.table_on_device()
            self.device_copy.offloaded()
            self.device_copy.slot_rows()

    def graph_safe(self) -> bool:
        """Whether a step can be a CUDA graph now: device mode always; host mode only while
        every expert is resident (no copy to decide)."""
        return self.device_copy is not None or self.fully_resident()

    def _weights(self, layer: int, expert: int, buffer: _Buffer) -> tuple[torch.Tensor, ...]:
        pages = self.table.pages(layer, expert)
        if pages is not None:
            source, ids = self.pool.view(PageType.EXPERT), pages
        elif self.device_copy is not None:  # its slot's pool pages, filled by this step's copy
            source, ids = self.pool.view(PageType.EXPERT), self.device_copy.pages_of(layer, expert)
        else:
            slot = buffer.slot_of[expert]
            source, ids = buffer.pages, (3 * slot, 3 * slot + 1, 3 * slot + 2)
        w1 = source[ids[0]].view(self.inter, self.hidden)  # [I, D]
        w3 = source[ids[1]].view(self.inter, self.hidden)  # [I, D]
        w2 = source[ids[2]].view(self.hidden, self.inter)  # [D, I]
        return w1, w3, w2

    def _moe_torch(self, layer, x, topk_ids, topk_weights, buffer, needed) -> torch.Tensor:
        out = torch.zeros_like(x)  # [T, D]
        for e in needed:  # ascending expert id, whatever the residency
            tokens, slots = torch.nonzero(topk_ids == e, as_tuple=True)
            w1, w3, w2 = self._weights(layer, e, buffer)
            xe = x[tokens]  # [n, D]
            h = F.silu(F.linear(xe, w1)) * F.linear(xe, w3)  # [n, I]
            ye = F.linear(h, w2) * topk_weights[tokens, slots, None]  # [n, D]
            out.index_add_(0, tokens, ye.to(x.dtype))
        return out

    def _moe_kernel(self, layer, x, topk_ids, topk_weights, buffer) -> torch.Tensor:
        if not buffer.slot_of:  # every routed expert is in its pages: the cached device table
            table = self.table.on_device()[layer]
            return self.moe_kernel(
                x, topk_ids, topk_weights, self.pool.view(PageType.EXPERT), buffer.pages, table
            )
        table = self.table.host[layer].clone()  # [E, 3], built on the host, copied once
        for e, slot in buffer.slot_of.items():
            table[e] = torch.tensor([buffer_slot_id(3 * slot + i) for i in range(3)])
        table = table.to(self.device, non_blocking=True)
        return self.moe_kernel(
            x, topk_ids, topk_weights, self.pool.view(PageType.EXPERT), buffer.pages, table
        )

    @staticmethod
    def _matrix_bytes(t: torch.Tensor) -> int:
        return t.numel() * t.element_size()


def _slot_owner(slot: int) -> tuple[str, int]:
    """The allocator owner of loading slot `slot`'s three pages."""
    return ("loading slot", slot)
