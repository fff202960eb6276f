"""The loading buffers keep what a layer needs: a full buffer drops only predictions that the
layer does not use, so a correctly predicted expert is copied once, not twice."""

import torch

from rimuru.dataplane.engine.experts.copy_in import HostBufferCopyIn
from rimuru.dataplane.engine.experts.counters import ExpertCounters
from rimuru.dataplane.engine.experts.moe_backend import MoEBackend
from rimuru.dataplane.engine.experts.residency_table import ResidencyTable
from rimuru.dataplane.memory.allocator import PageAllocator
from rimuru.dataplane.memory.geometry import MemoryShape, PageGeometry
from rimuru.dataplane.memory.pool import UnifiedPool
from rimuru.dataplane.memory.reclaim import DeferredReclaim
from rimuru.dataplane.model.weights import ExpertWeights

L, E, INTER, D = 2, 8, 32, 32


def experts(slots: int) -> tuple[ResidencyTable, HostBufferCopyIn, MoEBackend]:
    """No expert resident: every routed one is copied into a loading buffer."""
    geometry = PageGeometry.from_shape(MemoryShape(L, E, D, INTER, 1, 16, 4))
    pool = UnifiedPool(geometry, 4, torch.float32)
    allocator = PageAllocator(geometry, 4)
    gen = torch.Generator().manual_seed(0)
    host = [
        ExpertWeights(
            *(torch.randn(E, *s, generator=gen) for s in ((INTER, D), (INTER, D), (D, INTER)))
        )
        for _ in range(L)
    ]
    counters = ExpertCounters()
    residency = ResidencyTable(pool, allocator, DeferredReclaim(allocator), host, counters)
    copy_in = HostBufferCopyIn(residency, counters, slots, top_k=1)
    return residency, copy_in, MoEBackend(residency, copy_in)


def test_a_full_buffer_keeps_the_prediction_the_layer_needs():
    residency, copy_in, moe = experts(slots=2)
    c = copy_in.counters
    copy_in.begin_step()
    copy_in._prefetch(1, [5, 7])  # layer 0 predicted 5 and 7 for layer 1: both slots full
    copies = c.buffer_copies
    x = torch.randn(2, D, generator=torch.Generator().manual_seed(1))
    out = moe.moe(1, x, torch.tensor([[2], [5]]), torch.ones(2, 1))  # needs 2 (new) and 5
    assert c.buffer_copies - copies == 1  # only 2 is copied; 5 stays in its slot
    assert copy_in.buffers[1].slot_of == {5: 0, 2: 1}  # 7, the unused prediction, made room
    assert c.predictor_hits == 1
    w = [residency.host[1].expert(e) for e in (2, 5)]
    expected = torch.stack(
        [
            (torch.nn.functional.silu(x[i] @ w1.T) * (x[i] @ w3.T)) @ w2.T
            for i, (w1, w3, w2) in enumerate(w)
        ]
    )
    assert torch.allclose(out, expected, atol=1e-5)
