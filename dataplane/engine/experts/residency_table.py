"""The residency table: which routed experts lie in pool expert pages, and in which pages.

Residency per (layer, expert): in three pool expert pages (w1, w3, w2), or on the host (the
backing store: every expert's matrices, pinned on CUDA). With device copy-in
(device_copy.py) an offloaded expert also has pool pages, its loading slot's: slots are
taken from the pool only while some layer has that many experts offloaded, so they come
and go with residency, and this table keeps them (`loading_slots`). How a non-resident
expert reaches the MoE is the copy-in's business (copy_in.py), not this table's.

Layers here are MoE layers (ModelConfig.moe_layers): a dense layer has no experts, so layer l
is the l-th MoE layer.

Ordering rules that must stay true:
  * a page table row points at pool pages only after the copy into them completed;
  * an evicted expert's pages are released through deferred reclaim, never reused while
    a forward that may read them is in flight (or handed to a new loading slot, which the
    next forward writes before any read).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import torch

from rimuru.dataplane.adjust.adjuster import ChangeList, ExpertLoad
from rimuru.dataplane.engine.experts.counters import ExpertCounters
from rimuru.dataplane.engine.experts.device_copy import LoadingSlots
from rimuru.dataplane.memory.allocator import PageAllocator
from rimuru.dataplane.memory.geometry import PageType
from rimuru.dataplane.memory.pool import UnifiedPool
from rimuru.dataplane.memory.reclaim import DeferredReclaim
from rimuru.dataplane.memory.tables import ExpertPageTable
from rimuru.dataplane.model.weights import ExpertWeights


class ResidencyTable:
    def __init__(
        self,
        pool: UnifiedPool,
        allocator: PageAllocator | None,
        reclaim: DeferredReclaim,
        host_experts: Sequence[ExpertWeights],
        counters: ExpertCounters,
        *,
        num_loading_slots: int = 0,
        own_slots: bool = True,
    ):
        """num_loading_slots: device copy-in's slots per layer at most (> 0 keeps them in
        pool pages, `loading_slots`); 0 for host copies, whose buffers lie outside the pool.
        own_slots: the slots' pages are taken from and given back to `allocator` here; False
        on a tensor-parallel follower (no allocator), which is handed rank 0's
        (LoadingSlots.set_slots). counters: evictions, loads and their bytes are counted
        there."""
        self.pool = pool
        self.allocator = allocator
        self.reclaim = reclaim
        self.host = list(host_experts)
        self.counters = counters
        self.num_layers = len(self.host)
        self.num_experts = self.host[0].w1.shape[0]
        self.device = pool.device
        self.table = ExpertPageTable(self.num_layers, self.num_experts, self.device)
        self.resident: list[set[int]] = [set() for _ in range(self.num_layers)]
        self.residency_version = 0  # bumped whenever `resident` changes (caches key on it)
        self._sets: list[frozenset[int]] = []
        self._sets_version = -1  # the residency_version _sets was built at
        # What apply, load_initial and release_all changed since take_moves, in order
        # (sched/round_moves.py); a follower's place/evict replay them and are not kept.
        self._moves: list[ChangeList] = []
        self.own_slots = own_slots
        self.loading_slots = (
            LoadingSlots(self.table, self.resident, num_loading_slots, self.device)
            if num_loading_slots > 0
            else None
        )
        # Loads copy on their own stream (host copies into loading buffers share it).
        self.copy_stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None

    # ------------------------------------------------------------------ reading
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

    def fully_resident(self) -> bool:
        """Every expert of every layer lies in its pool pages (what a CUDA graph needs)."""
        return all(len(r) == self.num_experts for r in self.resident)

    def all_resident(self, layer: int) -> bool:
        """Every expert of `layer` lies in its pool pages; true past the last layer."""
        return layer >= self.num_layers or len(self.resident[layer]) == self.num_experts

    def refresh_device_tables(self) -> None:
        """Bring every table a captured step reads up to date, in place (a replay runs no
        Python, so nothing inside it would): the page table and, with loading slots, the
        copy-in rows. Stream-ordered after the loads' copies (place() waits for them)."""
        self.table.on_device()
        if self.loading_slots is not None:
            self.loading_slots.table_on_device()
            self.loading_slots.offloaded()
            self.loading_slots.slot_rows()

    # ------------------------------------------------------------------ changing
    def place(self, layer: int, expert: int, pages: tuple[int, ...]) -> None:
        """Copy an expert into reserved pool pages, then point its table row at them."""
        w1, w3, w2 = self.host[layer].expert(expert)
        view = self.pool.view(PageType.EXPERT)
        stream = self.copy_stream
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
        self.counters.bytes_h2d += 3 * w1.numel() * w1.element_size()
        self.table.set_pages(layer, expert, tuple(pages))
        self.resident[layer].add(expert)
        self.residency_version += 1
        if self.loading_slots is not None:
            self.loading_slots.mark_stale(layer)
            self._release_slots_beyond(self.loading_slots.slots_needed())  # unused ones

    def evict(self, layer: int, expert: int, last_step: int) -> None:
        if self.loading_slots is not None and expert in self.resident[layer]:
            self.loading_slots.check_evict(layer)  # the expert stays resident, nothing leaks
        self._drop(layer, expert, last_step)

    def take_moves(self) -> tuple[ChangeList, ...]:
        """The change lists applied since the last call, oldest first."""
        moves, self._moves = tuple(self._moves), []
        return moves

    def apply(self, changes: ChangeList, last_step: int) -> None:
        """Evictions first (their pages free after `last_step`), then the reserved loads."""
        for layer, expert in changes.evict:
            self.evict(layer, expert, last_step)
        for load in changes.load:
            self.place(load.layer, load.expert, load.pages)
            self.counters.loads += 1
        if changes:
            self._moves.append(changes)

    def load_initial(self, experts: Sequence[tuple[int, int]], pages_per_expert: int) -> None:
        """Start-up residency; raises if the pool cannot hold them."""
        loads = []
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
            loads.append(ExpertLoad(layer, expert, tuple(pages)))
        self._moves.append(ChangeList(load=tuple(loads)))
        if self.loading_slots is not None:  # a residency past the slots fails here, not mid-step
            self._take_slots()
            self.loading_slots.offloaded()

    def release_all(self) -> None:
        """Every expert off the device, only to re-choose residency: load_initial follows.
        Past the loading slots on purpose (evict() would refuse): their rows are derived
        only when next read, after load_initial."""
        evicted = []
        for layer in range(self.num_layers):
            for expert in sorted(self.resident[layer]):
                self._drop(layer, expert, last_step=self.reclaim.last_completed_step)
                evicted.append((layer, expert))
        self._moves.append(ChangeList(evict=tuple(evicted)))
        if self.loading_slots is not None:  # load_initial takes them again
            self._release_slots_beyond(0)

    def _drop(self, layer: int, expert: int, last_step: int) -> None:
        pages = self.table.pages(layer, expert)
        if pages is None or expert not in self.resident[layer]:
            raise ValueError(f"expert {expert} of layer {layer} is not resident")
        self.table.clear(layer, expert)
        self.resident[layer].discard(expert)
        self.residency_version += 1
        owner = ("expert", layer, expert)
        slots = self.loading_slots
        if slots is not None:
            slots.mark_stale(layer)
            if self.own_slots and len(slots.slots) < slots.slots_needed():
                # The layer now offloads more experts than there are slots: this expert's
                # pages become the new slot (no forward reads them as the expert's again,
                # and the next one that reads the slot writes it first).
                self.allocator.transfer(
                    PageType.EXPERT, pages, owner, _slot_owner(len(slots.slots))
                )
                slots.add_slot(pages)
                pages = ()
        self.reclaim.release(PageType.EXPERT, pages, owner, last_step)
        self.counters.evictions += 1

    def _release_slots_beyond(self, keep: int) -> None:
        """The last slots past `keep` back to the pool (after the last forward that may have
        read them: they were read only by forwards before this call)."""
        slots = self.loading_slots
        while self.own_slots and len(slots.slots) > keep:
            slot = len(slots.slots) - 1
            self.reclaim.release(
                PageType.EXPERT, slots.pop_slot(), _slot_owner(slot),
                self.reclaim.last_completed_step,
            )  # fmt: skip

    def _take_slots(self) -> None:
        """Slots for the residency set at start-up, from the pool's free pages."""
        slots = self.loading_slots
        while self.own_slots and len(slots.slots) < slots.slots_needed():
            slot = len(slots.slots)
            pages = self.allocator.allocate(PageType.EXPERT, 3, _slot_owner(slot))
            if pages is None:
                raise ValueError(
                    f"the pool cannot hold loading slot {slot} (three expert pages) beside the "
                    f"experts this policy keeps resident: raise the memory budget"
                )
            slots.add_slot(tuple(pages))


def _slot_owner(slot: int) -> tuple[str, int]:
    """The allocator owner of loading slot `slot`'s three pages."""
    return ("loading slot", slot)
