"""Expert copy-in decided on the device (`expert_copy="device"`, the default): the
alternative to the host-driven loading buffers (copy_in.HostBufferCopyIn). This module
holds the loading slots and the tables the kernels read through them (`LoadingSlots`,
kept by the residency table, since slots come and go with residency) and the torch
reference of the copy kernel; copy_in.DeviceCopyIn launches the copy per layer.

Host mode reads each layer's routing on the host, then copies the missing experts with
cudaMemcpyAsync, prefetching layer l+1's predicted experts while layer l computes. That
costs one host synchronisation per layer with offloaded experts, so such a step can never
be a CUDA graph: under an elastic policy most steps route to some offloaded expert, so
most steps run eagerly, each several times as long as a replayed graph.

Device mode gives every offloaded expert of a layer a fixed loading slot (its rank among
the layer's offloaded experts; at most `slots` of them, which expert_offload_limit already
guarantees). A slot is three pool expert pages: slots are taken from the pool only while
some layer has that many experts offloaded (an eviction that needs one more slot hands its
own pages to it; a load that leaves a slot unused frees it), so a policy that offloads
nothing holds the memory of one that offloads nothing. After the router, one kernel
(kernels/expert_copy.py) copies the routed ones from pinned host memory into their slots'
pages; the MoE kernel then reads them through a table whose rows already point there, as
it reads any resident expert. The step needs no host decision,
so it can be captured. What it gives up: the copy no longer overlaps the previous layer's
compute (it runs on the compute stream, after the router), and it reads host memory from a
kernel rather than with the copy engines. Keeping every step a graph outweighs both, which
is why device mode is the default.

Invariants:
  * `table` (the kernels' [L, E, 3] table) equals the expert page table for resident
    experts; an offloaded expert's row names its slot's three pool pages. It, `offloaded`
    [L, S] and the slots' pages [3S] are derived from the residency table's page table,
    resident sets and slots lazily: a layer whose residency changed is re-derived when next read, before
    a forward, in place (a captured graph keeps their addresses);
  * slot s exists while some layer has more than s experts offloaded, and nothing else owns
    its pages;
  * the slots serve every layer: a layer's copy overwrites them only after the previous
    layer's MoE read them, since both run on the one compute stream, in order.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rimuru.dataplane.memory.tables import DeviceMirror, ExpertPageTable


class LoadingSlots:
    def __init__(
        self, pages: ExpertPageTable, resident: list[set[int]], num_slots: int, device
    ):  # fmt: skip
        """pages, resident: the residency table's own page table and resident sets (read;
        residency_table.ResidencyTable builds this object and tells it what changed)."""
        self.pages, self.resident = pages, resident
        num_layers, num_experts = len(resident), pages.host.shape[1]
        self.num_experts, self.num_slots = num_experts, num_slots
        self._table = ExpertPageTable(num_layers, num_experts, device)
        # [L, S] int32: the expert in each slot, -1 = unused
        self._offloaded = DeviceMirror(
            torch.full((num_layers, num_slots), -1, dtype=torch.int32), device
        )
        # [3S] int32: the pool page of each slot's w1, w3, w2 (-1: the slot holds no pages)
        self._slot_rows = DeviceMirror(torch.full((3 * num_slots,), -1, dtype=torch.int32), device)
        self.slots: list[tuple[int, int, int]] = []  # the pages of slots 0, 1, ...
        self._stale = set(range(num_layers))

    # ------------------------------------------------------------------ slots
    def slots_needed(self) -> int:
        """Slots the residency needs now: the most experts any layer has offloaded."""
        return min(self.num_slots, max(self.num_experts - len(r) for r in self.resident))

    def add_slot(self, pages: tuple[int, int, int]) -> None:
        self.slots.append(tuple(pages))
        self._slots_changed()

    def pop_slot(self) -> tuple[int, int, int]:
        pages = self.slots.pop()
        self._slots_changed()
        return pages

    def set_slots(self, slots: Sequence[tuple[int, int, int]]) -> None:
        """Every slot at once (a tensor-parallel follower takes rank 0's)."""
        if list(slots) != self.slots:
            self.slots = [tuple(p) for p in slots]
            self._slots_changed()

    def _slots_changed(self) -> None:
        if len(self.slots) > self.num_slots:
            raise RuntimeError(f"{len(self.slots)} loading slots; at most {self.num_slots}")
        rows = torch.full((3 * self.num_slots,), -1, dtype=torch.int32)
        if self.slots:
            rows[: 3 * len(self.slots)] = torch.tensor(self.slots, dtype=torch.int32).ravel()
        self._slot_rows.host.copy_(rows)
        self._slot_rows.mark_dirty()
        self._stale.update(range(len(self.resident)))

    def slot_rows(self) -> torch.Tensor:
        """[3S] int32 on the engine's device (fixed address): each slot's pool pages."""
        self._derive_stale()
        return self._slot_rows.on_device()

    def mark_stale(self, layer: int) -> None:
        """The layer's residency changed: re-derive its rows before they are next read."""
        self._stale.add(layer)

    def check_evict(self, layer: int) -> None:
        """Refuse, before anything changes, an eviction that would leave the layer with
        more experts offloaded than the buffer has slots."""
        self.check_fits(layer, self.num_experts - len(self.resident[layer]) + 1)

    def check_fits(self, layer: int, num_offloaded: int) -> None:
        if num_offloaded > self.num_slots:
            raise RuntimeError(
                f"layer {layer} would have {num_offloaded} experts offloaded but the loading "
                f"buffer has {self.num_slots} slots: expert_offload_limit must not exceed the "
                f"slots"
            )

    def table_on_device(self) -> torch.Tensor:
        """[L, E, 3] int32 on the engine's device (fixed address)."""
        self._derive_stale()
        return self._table.on_device()

    def offloaded(self) -> torch.Tensor:
        """[L, S] int32 on the engine's device (fixed address)."""
        self._derive_stale()
        return self._offloaded.on_device()

    def pages_of(self, layer: int, expert: int) -> tuple[int, int, int]:
        """The pool pages an offloaded expert is copied into (its slot's)."""
        self._derive_stale()
        return self.slots[self._offloaded.host[layer].tolist().index(expert)]

    def _derive_stale(self) -> None:
        for layer in sorted(self._stale):
            offloaded = [e for e in range(self.num_experts) if e not in self.resident[layer]]
            self.check_fits(layer, len(offloaded))
            if len(offloaded) > len(self.slots):
                raise RuntimeError(
                    f"layer {layer} has {len(offloaded)} experts offloaded but only "
                    f"{len(self.slots)} loading slots hold pages"
                )
            rows = self.pages.host[layer].clone()  # resident rows: their pool pages
            slots = torch.full((self.num_slots,), -1, dtype=torch.int32)
            for s, e in enumerate(offloaded):
                rows[e] = torch.tensor(self.slots[s], dtype=torch.int32)
                slots[s] = e
            self._table.replace_layer(layer, rows)
            self._offloaded.host[layer] = slots
            self._offloaded.mark_dirty()
        self._stale.clear()


def copy_routed_experts_torch(
    counts, offloaded, w1, w3, w2, pages, slot_rows, copied
) -> None:  # fmt: skip
    """The CPU path of kernels.copy_routed_experts (the engine's CPU install has no Triton):
    the routed experts among `offloaded` into their slots' pages, counted in `copied`."""
    matrix_elems = w1.shape[1] * w1.shape[2]
    routed, rows = counts.cpu(), slot_rows.tolist()
    for slot, expert in enumerate(offloaded.tolist()):
        if expert >= 0 and int(routed[expert]) > 0:
            for m, w in enumerate((w1, w3, w2)):
                pages[rows[3 * slot + m], :matrix_elems].copy_(w[expert].reshape(-1))
            copied += 1
