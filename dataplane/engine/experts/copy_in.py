"""Copy-in: how a routed expert that is not resident reaches the MoE, one implementation per
`expert_copy` mode (startup/expert_parts.py maps the mode to one).

HostBufferCopyIn (`expert_copy="host"`): two loading buffers outside the pool, alternated by
layer, hold copies of non-resident experts for one step: while layer l computes from buffer
l % 2, the experts predicted for layer l + 1 (layer l+1's router applied to layer l's MoE
input, the cross-layer prediction of pre-gating systems) are copied into buffer (l + 1) % 2.
Experts that were not predicted are copied before the layer computes. One host
synchronisation per layer with offloaded experts.

DeviceCopyIn (`expert_copy="device"`, the default; device_copy.py says why): after the
router, one kernel copies the routed offloaded experts into their loading slots' pool pages
(the residency table's `loading_slots`); no host decision, so a step can be a CUDA graph.

Both count their copies in the shared ExpertCounters; device copy-in counts on the device
and the engine folds that count into its read of the step's tokens (forward/in_flight.py).

Shape key: T = tokens, D = hidden, I = expert intermediate, E = experts, K = top-k,
S = loading-buffer slots (experts) per buffer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from rimuru.dataplane.engine.experts.counters import ExpertCounters
from rimuru.dataplane.engine.experts.residency_table import ResidencyTable
from rimuru.dataplane.engine.experts.routing_histogram import (
    RoutingHistogram,
    routing_histogram_torch,
)
from rimuru.dataplane.memory.geometry import PageType
from rimuru.dataplane.memory.tables import buffer_slot_id

# (source, rows): an expert's w1, w3, w2 are rows `rows` of `source` ([*, I*D])
ExpertRows = tuple[torch.Tensor, tuple[int, int, int]]


class CopyIn(Protocol):
    """What the MoE backend and the engine ask of a copy-in strategy."""

    num_slots: int  # experts a loading buffer holds

    @property
    def buffer_bytes(self) -> int: ...

    def begin_step(self) -> None: ...

    def fetch(
        self, layer: int, x: torch.Tensor, counts: torch.Tensor,
        count_rows: torch.Tensor | None, host_routed: bool,
    ) -> list[int] | None:  # fmt: skip
        """Bring `layer`'s routed non-resident experts where its MoE reads them (`counts`
        [E]: its tokens per expert). Returns the routed experts, ascending, where they were
        read on the host (always when `host_routed`: the torch path needs them), else None."""
        ...

    def kernel_table(self, layer: int) -> torch.Tensor:
        """[E, 3] int32 on the device: where the MoE kernel reads each expert (after fetch)."""
        ...

    def buffer(self, layer: int) -> torch.Tensor:
        """[3S, I*D]: the loading buffer the kernel table's buffer rows name."""
        ...

    def rows_of(self, layer: int, expert: int) -> ExpertRows:
        """Where a non-resident routed expert was copied this step (the torch path)."""
        ...

    def graph_safe(self) -> bool:
        """Whether a step can be a CUDA graph now (no host decision inside it)."""
        ...

    def device_count(self) -> DeviceCopyCount | None:
        """The copies counted on the device (device copy-in), or None: counted on the host."""
        ...


def _expert_bytes(w1: torch.Tensor) -> int:
    """One expert's three matrices, from its w1 (w3 and w2 are as large)."""
    return 3 * w1.numel() * w1.element_size()


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


class HostBufferCopyIn:
    """Host-decided copies into loading buffers outside the pool (module doc)."""

    def __init__(
        self,
        residency: ResidencyTable,
        counters: ExpertCounters,
        num_slots: int,
        *,
        router_logits: Callable[[int, torch.Tensor], torch.Tensor] | None = None,
        top_k: int = 1,
        histogram: RoutingHistogram = routing_histogram_torch,
        num_buffers: int = 2,
    ):
        """residency: read (which experts need a copy; the copy stream is its). router_logits:
        layer l's router over a hidden state, to predict layer l+1's experts (None: no
        prefetch); histogram: tokens per expert of the prediction."""
        self.residency = residency
        self.counters = counters
        self.host = residency.host
        self.num_slots = max(1, num_slots)
        self.router_logits = router_logits
        self.top_k = top_k
        self.histogram = histogram
        self.device = residency.device
        self._copy_stream = residency.copy_stream
        _, inter, hidden = self.host[0].w1.shape
        rows, dtype = 3 * self.num_slots, residency.pool.expert_dtype  # [3S, I*D] per buffer
        self.buffers = [
            _Buffer(torch.empty(rows, inter * hidden, dtype=dtype, device=self.device))
            for _ in range(num_buffers)
        ]

    @property
    def buffer_bytes(self) -> int:
        return sum(b.pages.numel() * b.pages.element_size() for b in self.buffers)

    def begin_step(self) -> None:
        for b in self.buffers:
            b.reset(-1)

    def graph_safe(self) -> bool:
        return self.residency.fully_resident()

    def fetch(self, layer, x, counts, count_rows, host_routed) -> list[int] | None:
        r = self.residency
        buffer = self._buffer_of(layer)
        if not host_routed and r.all_resident(layer) and r.all_resident(layer + 1):
            # Nothing to copy for this layer and nothing to predict for the next: no host
            # synchronisation at all (the kernel reads every expert from its pages).
            return None
        # One host synchronisation per layer: this layer's routing histogram and, when
        # predicting, the histogram of layer l+1's router applied to this layer's input.
        num_experts = r.num_experts
        predict = self.router_logits is not None and layer + 1 < r.num_layers
        if predict:
            guess = torch.topk(self.router_logits(layer + 1, x), self.top_k, dim=-1).indices
            counts = torch.stack((counts, self.histogram(guess, num_experts, count_rows)))
        host = counts.cpu().view(-1, num_experts)  # [1 or 2, E]
        needed = torch.nonzero(host[0]).flatten().tolist()
        missing = [e for e in needed if e not in r.resident[layer]]
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
        return needed

    def kernel_table(self, layer: int) -> torch.Tensor:
        buffer = self.buffers[layer % len(self.buffers)]
        if not buffer.slot_of:  # every routed expert is in its pages: the cached device table
            return self.residency.table.on_device()[layer]
        table = self.residency.table.host[layer].clone()  # [E, 3], built on the host, copied once
        for e, slot in buffer.slot_of.items():
            table[e] = torch.tensor([buffer_slot_id(3 * slot + i) for i in range(3)])
        return table.to(self.device, non_blocking=True)

    def buffer(self, layer: int) -> torch.Tensor:
        return self.buffers[layer % len(self.buffers)].pages

    def rows_of(self, layer: int, expert: int) -> ExpertRows:
        slot = self.buffers[layer % len(self.buffers)].slot_of[expert]
        return self.buffer(layer), (3 * slot, 3 * slot + 1, 3 * slot + 2)

    def _buffer_of(self, layer: int) -> _Buffer:
        buffer = self.buffers[layer % len(self.buffers)]
        if buffer.layer != layer:
            buffer.reset(layer)
        return buffer

    def _prefetch(self, next_layer: int, predicted: list[int]) -> None:
        """Copy layer l+1's predicted non-resident experts into the other buffer while
        layer l computes. The copy stream first waits for the compute queued so far (the
        previous user of that buffer, layer l-1, must be done reading it); layer l+1
        waits for the copies' event before it computes."""
        buffer = self.buffers[next_layer % 2]
        buffer.reset(next_layer)
        if self._copy_stream is not None:
            self._copy_stream.wait_stream(torch.cuda.current_stream(self.device))
        resident = self.residency.resident[next_layer]
        for e in predicted:
            if e not in resident and len(buffer.slot_of) < self.num_slots:
                self._copy_to_buffer(buffer, next_layer, e)
        if self._copy_stream is not None and buffer.slot_of:
            buffer.ready = self._copy_stream.record_event()

    def _copy_to_buffer(self, buffer: _Buffer, layer: int, expert: int) -> None:
        if len(buffer.slot_of) >= self.num_slots:
            # Full of predictions: drop the ones this layer does not use.
            unused = [e for e in buffer.slot_of if e not in buffer.used]
            if not unused:
                raise RuntimeError(
                    f"layer {layer} needs more than {self.num_slots} non-resident experts "
                    f"in one step: the loading buffer is smaller than expert_offload_limit"
                )
            del buffer.slot_of[unused[0]]
        slot = min(set(range(self.num_slots)) - set(buffer.slot_of.values()))
        stream = self._copy_stream
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            for i, matrix in enumerate(self.host[layer].expert(expert)):
                buffer.pages[3 * slot + i].copy_(
                    matrix.reshape(-1), non_blocking=stream is not None
                )
        buffer.slot_of[expert] = slot
        self.counters.buffer_copies += 1
        self.counters.bytes_h2d += _expert_bytes(self.host[layer].w1[expert])

    # Host copies are counted on the host, as they are made: nothing to read back.
    def device_count(self) -> None:
        return None  # each copy is counted on the host as it is made (_copy_to_buffer)


class DeviceCopyIn:
    """Device-decided copies into the residency table's loading slots (module doc)."""

    def __init__(
        self,
        residency: ResidencyTable,
        counters: ExpertCounters,
        copy_kernel: Callable[..., None],
    ):
        """residency: must keep loading slots (num_loading_slots > 0); copy_kernel:
        kernels.copy_routed_experts, or device_copy.copy_routed_experts_torch on the CPU."""
        if residency.loading_slots is None:
            raise ValueError("device copy-in needs a residency table with loading slots")
        self.slots = residency.loading_slots
        self.counters = counters
        self.copy_kernel = copy_kernel
        self.host = residency.host
        self.num_slots = self.slots.num_slots
        self._pages = residency.pool.view(PageType.EXPERT)
        _, inter, hidden = self.host[0].w1.shape
        # The MoE kernel's buffer argument, never read (every row names pool pages): a
        # single slot, one buffer for every layer (copy and compute share the stream).
        self.buffers = [
            torch.empty(
                3, inter * hidden, dtype=residency.pool.expert_dtype, device=residency.device
            )
        ]
        self.count = DeviceCopyCount(counters, _expert_bytes(self.host[0].w1[0]), residency.device)

    @property
    def buffer_bytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers)

    def begin_step(self) -> None:
        pass  # the slots' rows follow residency; nothing lasts a step only

    def graph_safe(self) -> bool:
        return True

    def fetch(self, layer, x, counts, count_rows, host_routed) -> list[int] | None:
        offloaded = self.slots.offloaded()[layer]  # [S]
        w, rows = self.host[layer], self.slots.slot_rows()
        self.copy_kernel(
            counts, offloaded, w.w1, w.w3, w.w2, self._pages, rows, self.count.on_device
        )
        if host_routed:  # the CPU path
            return torch.nonzero(counts.cpu()).flatten().tolist()
        return None

    def kernel_table(self, layer: int) -> torch.Tensor:
        return self.slots.table_on_device()[layer]

    def buffer(self, layer: int) -> torch.Tensor:
        return self.buffers[0]

    def rows_of(self, layer: int, expert: int) -> ExpertRows:
        """Its slot's pool pages, filled by this step's copy."""
        return self._pages, self.slots.pages_of(layer, expert)

    def device_count(self) -> DeviceCopyCount:
        return self.count


class DeviceCopyCount:
    """The experts device copy-in copied, counted on the device by the copy kernel and read
    back once a step with the sampled tokens (one wait; forward/in_flight.py)."""

    def __init__(self, counters: ExpertCounters, expert_bytes: int, device: torch.device):
        self.counters = counters
        self.expert_bytes = expert_bytes
        self.on_device = torch.zeros(1, dtype=torch.int32, device=device)

    def restart(self) -> None:
        """Zero the count, queued behind the read of it: the next step's kernels add after."""
        self.on_device.zero_()

    def add(self, copies: int) -> None:
        """Count `copies`, read from `on_device` (restarted behind that read)."""
        self.counters.buffer_copies += copies
        self.counters.bytes_h2d += copies * self.expert_bytes

    def sync(self) -> None:
        """Read and restart now (a wait on the device; the engine folds the read into its
        read of the tokens instead)."""
        self.add(int(self.on_device.item()))
        self.restart()
