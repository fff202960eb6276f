"""A follower rank (1..N-1): its slice of the model, its own pool, no scheduler.

It builds what the forward needs exactly as the engine does (the same functions, in the
same order, so start-up collectives meet rank 0's) and nothing that decides: no
allocator, no scheduler, no adjuster, no sampler. Every page id it uses comes from rank 0
in a StepMessage; after applying one it checks its expert page table against rank 0's
digest, then runs the step's forward.
"""

from __future__ import annotations

import logging
import traceback
from dataclasses import replace

import torch

from rimuru.dataplane.engine.forward.block_table_store import DeviceBlockTables
from rimuru.dataplane.engine.forward.paged_attention import PagedAttention
from rimuru.dataplane.engine.forward.paged_states import PagedStates
from rimuru.dataplane.engine.startup.budget import plan_memory
from rimuru.dataplane.engine.startup.config import EngineConfig
from rimuru.dataplane.engine.startup.expert_parts import build_expert_parts
from rimuru.dataplane.engine.startup.loaded_model import load_model
from rimuru.dataplane.engine.startup.setup import (
    activation_reserve,
    budget_bytes,
    buffer_slots,
    loading_buffer_bytes,
    warm_up_kernels,
)
from rimuru.dataplane.engine.step_forward import run_forward
from rimuru.dataplane.memory.geometry import BLOCK_SIZE
from rimuru.dataplane.memory.pool import UnifiedPool
from rimuru.dataplane.memory.tables import NOT_PRESENT
from rimuru.dataplane.parallel.block_tables import BlockTableMirror
from rimuru.dataplane.parallel.groups import RankGroups
from rimuru.dataplane.parallel.messages import (
    RankReport,
    Shutdown,
    StartEngine,
    StepMessage,
    StopEngine,
)
from rimuru.dataplane.parallel.rank import RankLink, rank_config
from rimuru.dataplane.parallel.residency import apply_changes, table_digest
from rimuru.dataplane.parallel.watchdog import fatal, watch_parent

log = logging.getLogger("rimuru.parallel")


class _RankZeroReclaims:
    """A follower's stand-in for deferred reclaim: it never hands out a page, so it has
    nothing to reclaim. Rank 0 reuses an evicted page only after its own reclaim frees it,
    and this rank has finished the forward that last read it before it reads the message
    that reuses it (`FollowerRank.step` synchronises)."""

    def release(self, *args, **kwargs) -> None:
        pass


class FollowerRank:
    def __init__(self, config: EngineConfig, link: RankLink):
        self.config = config
        self.rank = link.groups.rank
        self.device = torch.device(config.device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        loaded, paths = load_model(config, self.device, link)
        mc = loaded.config
        # ---- the memory plan, in Engine.__init__'s order (no CUDA graphs: rank_config)
        budget = budget_bytes(config, loaded)
        slots = buffer_slots(config, mc)
        buffer_bytes = loading_buffer_bytes(config, slots, loaded.geometry)
        reserve_bytes = activation_reserve(config, loaded, paths)
        warm_up_kernels(config, loaded, paths)
        plan = plan_memory(
            budget, loaded.non_pool_weight_bytes, reserve_bytes, buffer_bytes, loaded.geometry
        )
        self.plan = link.agree_plan(plan)
        pool = UnifiedPool(
            loaded.geometry, self.plan.num_huge_pages, loaded.dtype, self.device,
            expert_dtype=loaded.config.expert_dtype,
        )  # fmt: skip
        # no allocator: page ids are rank 0's, and so are the loading slots
        _, self.residency, self.copy_in, moe = build_expert_parts(
            loaded, paths, pool, None, _RankZeroReclaims(), slots, own_slots=False
        )
        attention = PagedAttention(pool, kernels=paths.attention_kernels())
        if mc.is_hybrid:  # this rank's heads' states, in the pages rank 0 gave the request
            states = PagedStates(pool, mc.linear_attention, paths.use_kernels)
            self.model = loaded.model.with_backends(attention, moe, states)
        else:
            self.model = loaded.model.with_backends(attention, moe)
        self.block_tables = BlockTableMirror()
        self.device_tables = DeviceBlockTables.for_engine(
            mc.num_kv_layers, config.max_num_seqs, loaded.max_model_len, BLOCK_SIZE,
            self.device,
        )  # fmt: skip
        self.num_steps = self.num_evictions = self.num_loads = 0
        self.residency_digest = ""

    def step(self, message: StepMessage) -> None:
        apply_changes(self.residency, message.changes, message.step)
        if self.residency.loading_slots is not None:
            self.residency.loading_slots.set_slots(message.slots)
        self.num_evictions += len(message.changes.evict)
        self.num_loads += len(message.changes.load)
        self.check_invariants(message.residency_digest, full=bool(message.changes))
        slices = self.block_tables.slices(message.blocks, message.batch.slices)
        self.copy_in.begin_step()
        batch = replace(message.batch, slices=slices)
        run_forward(batch, self.model, None, None, self.device_tables)
        if (count := self.copy_in.device_count()) is not None:
            count.sync()
        if self.device.type == "cuda":  # the forward has read its pages: see _RankZeroReclaims
            torch.cuda.synchronize(self.device)
        self.num_steps += 1

    def check_invariants(self, rank_zero_digest: str, *, full: bool = True) -> None:
        """Same expert page table as rank 0's; and, when `full` (after changes), resident
        exactly where a row has pages and no page held by two experts."""
        table = self.residency.table.host
        digest = table_digest(table)
        if digest != rank_zero_digest:
            raise AssertionError(
                f"rank {self.rank}'s expert page table ({digest}) differs from rank 0's "
                f"({rank_zero_digest})"
            )
        self.residency_digest = digest
        if not full:
            return
        has_pages = table[..., 0] != NOT_PRESENT  # [L, E]
        for layer, resident in enumerate(self.residency.resident):
            rows = set(torch.nonzero(has_pages[layer]).flatten().tolist())
            if rows != resident:
                raise AssertionError(f"layer {layer}: resident {resident}, table rows {rows}")
        pages = table[has_pages].flatten()
        if len(pages) != len(set(pages.tolist())):
            raise AssertionError(f"rank {self.rank}: a pool page is held by two experts")

    def report(self) -> RankReport:
        return RankReport(
            self.rank, self.num_steps, self.num_evictions, self.num_loads, self.residency_digest
        )


def serve_engine(config: EngineConfig, link: RankLink) -> RankReport:
    """Build this rank's engine and follow rank 0's steps until it stops it."""
    rank = FollowerRank(rank_config(config, link.groups.rank), link)
    while True:
        message = link.groups.receive()
        if isinstance(message, StepMessage):
            rank.step(message)
        elif isinstance(message, StopEngine):
            return rank.report()
        else:
            raise RuntimeError(f"unexpected message during an engine's life: {message!r}")


def follower_main(rank: int, size: int, port: int, device_type: str, threads: int) -> None:
    """A follower process: engines one after another until rank 0 says Shutdown. Any
    failure prints why and exits 1, which rank 0's watchdog turns into a stop of all."""
    logging.basicConfig(level=logging.WARNING, format=f"rank {rank}: %(message)s")
    watch_parent(rank)
    if device_type == "cpu":
        torch.set_num_threads(threads)
    try:
        groups = RankGroups.join(rank, size, device_type, RankGroups.connect(rank, size, port))
        link = RankLink(groups)
        while True:
            message = groups.receive()
            if isinstance(message, Shutdown):
                break
            if not isinstance(message, StartEngine):
                raise RuntimeError(f"expected StartEngine or Shutdown, got {message!r}")
            groups.gather(serve_engine(message.config, link))
        groups.leave()
    except BaseException as exc:  # any failure must stop every rank
        traceback.print_exc()
        fatal(f"tensor-parallel rank {rank} failed: {type(exc).__name__}: {exc}")
