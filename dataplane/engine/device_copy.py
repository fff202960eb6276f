"""Expert copy-in decided on the device (`expert_copy="device"`, the default): the
alternative to the host-driven loading buffers of expert_manager.py.

Host mode reads each layer's routing on the host, then copies the missing experts with
cudaMemcpyAsync, prefetching layer l+1's predicted experts while layer l computes. That
costs one host synchronisation per layer with offloaded experts, so such a step can never
be a CUDA graph: on the H200, Fig. 4's elastic run spent most of its steps eager, each
~8x as long as its graph-replayed steps (docs/benchmarks.md at 7a896af).

Device mode gives every offloaded expert of a layer a fixed loading-buffer slot (its rank
among the layer's offloaded experts; at most `slots` of them, which expert_offload_limit
already guarantees). After the router, one kernel (kernels/expert_copy.py) copies the
routed ones from pinned host memory into their slots; the MoE kernel then reads them
through a table whose rows already point at those slots. The step needs no host decision,
so it can be captured. What it gives up: the copy no longer overlaps the previous layer's
compute (it runs on the compute stream, after the router), and it reads host memory from a
kernel rather than with the copy engines. On the H200 it still ran Fig. 4's elastic at about
twice the output tokens/s of host copies (docs/benchmarks.md at 7a896af).

Invariants:
  * `table` (the kernels' [L, E, 3] table) equals the expert page table for resident
    experts; an offloaded expert's row names its slot's three buffer rows. Both it and
    `offloaded` [L, S] are derived from the manager's page table and residency, lazily: a
    layer whose residency changed is re-derived when either is next read, before a forward,
    in place (a captured graph keeps their addresses);
  * one loading buffer serves every layer: a layer's copy overwrites it only after the
    previous layer's MoE read it, since both run on the one compute stream, in order.
"""

from __future__ import annotations

import torch

from rimuru.dataplane.memory.tables import DeviceMirror, ExpertPageTable, buffer_slot_id


class DeviceCopyIn:
    def __init__(
        self, pages: ExpertPageTable, resident: list[set[int]], num_slots: int, device
    ):  # fmt: skip
        """pages, resident: the ExpertManager's own page table and residency sets (read)."""
        self.pages, self.resident = pages, resident
        num_layers, num_experts = len(resident), pages.host.shape[1]
        self.num_experts, self.num_slots = num_experts, num_slots
        self._table = ExpertPageTable(num_layers, num_experts, device)
        # [L, S] int32: the expert in each slot, -1 = unused
        self._offloaded = DeviceMirror(
            torch.full((num_layers, num_slots), -1, dtype=torch.int32), device
        )
        self._stale = set(range(num_layers))

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

    def slot_of(self, layer: int, expert: int) -> int:
        """The loading-buffer slot of an offloaded expert."""
        self._derive_stale()
        return self._offloaded.host[layer].tolist().index(expert)

    def _derive_stale(self) -> None:
        for layer in sorted(self._stale):
            offloaded = [e for e in range(self.num_experts) if e not in self.resident[layer]]
            self.check_fits(layer, len(offloaded))
            rows = self.pages.host[layer].clone()  # resident rows: their pool pages
            slots = torch.full((self.num_slots,), -1, dtype=torch.int32)
            for s, e in enumerate(offloaded):
                rows[e] = torch.tensor([buffer_slot_id(3 * s + m) for m in range(3)])
                slots[s] = e
            self._table.replace_layer(layer, rows)
            self._offloaded.host[layer] = slots
            self._offloaded.mark_dirty()
        self._stale.clear()


def copy_routed_experts_torch(counts, offloaded, w1, w3, w2, buffer_pages, copied) -> None:
    """The CPU path of kernels.copy_routed_experts (the engine's CPU install has no Triton):
    the routed experts among `offloaded` into their slots' rows, counted in `copied`."""
    matrix_elems = w1.shape[1] * w1.shape[2]
    routed = counts.cpu()
    for slot, expert in enumerate(offloaded.tolist()):
        if expert >= 0 and int(routed[expert]) > 0:
            for m, w in enumerate((w1, w3, w2)):
                buffer_pages[3 * slot + m, :matrix_elems].copy_(w[expert].reshape(-1))
            copied += 1
