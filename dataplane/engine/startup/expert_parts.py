"""The expert plane's three parts, built once over the engine's pool: the residency table
(which expert lies in which pages), the copy-in of `config.expert_copy` (how the others reach
the MoE) and the MoE backend the model calls. Rank 0's engine and every tensor-parallel
follower build them here, so both ranks' parts are alike; this is the one place that maps
`expert_copy` to a copy-in.
"""

from __future__ import annotations

from typing import NamedTuple

from rimuru.dataplane.engine.experts.copy_in import CopyIn, DeviceCopyIn, HostBufferCopyIn
from rimuru.dataplane.engine.experts.counters import ExpertCounters
from rimuru.dataplane.engine.experts.moe_backend import MoEBackend
from rimuru.dataplane.engine.experts.residency_table import ResidencyTable
from rimuru.dataplane.engine.startup.compute_paths import ComputePaths
from rimuru.dataplane.engine.startup.loaded_model import LoadedModel
from rimuru.dataplane.engine.startup.setup import num_loading_buffers
from rimuru.dataplane.memory.allocator import PageAllocator
from rimuru.dataplane.memory.pool import UnifiedPool
from rimuru.dataplane.memory.reclaim import DeferredReclaim


class ExpertParts(NamedTuple):
    counters: ExpertCounters  # written by the residency table and the copy-in
    residency: ResidencyTable
    copy_in: CopyIn
    moe: MoEBackend


def build_expert_parts(
    loaded: LoadedModel,
    paths: ComputePaths,
    pool: UnifiedPool,
    allocator: PageAllocator | None,
    reclaim: DeferredReclaim,
    slots: int,
    *,
    own_slots: bool = True,
) -> ExpertParts:
    """slots: experts per loading buffer (setup.buffer_slots; at least one is kept).
    allocator None and own_slots False: a follower, whose page ids are rank 0's."""
    counters = ExpertCounters()
    copy_kernel, histogram = paths.copy_kernel(), paths.routing_histogram()
    device_copy = copy_kernel is not None
    residency = ResidencyTable(
        pool, allocator, reclaim, loaded.host_experts, counters,
        num_loading_slots=max(1, slots) if device_copy else 0, own_slots=own_slots,
    )  # fmt: skip
    copy_in: CopyIn
    if device_copy:
        copy_in = DeviceCopyIn(residency, counters, copy_kernel)
    else:
        copy_in = HostBufferCopyIn(
            residency, counters, slots, router_logits=loaded.model.router_logits,
            top_k=loaded.config.top_k, histogram=histogram,
            num_buffers=num_loading_buffers(paths.config),
        )  # fmt: skip
    moe = MoEBackend(residency, copy_in, paths.moe_kernel(), histogram)
    return ExpertParts(counters, residency, copy_in, moe)
