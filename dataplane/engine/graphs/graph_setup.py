"""The CUDA graphs' set-up: whether they serve this engine, their memory, planned before
the pool (`GraphPlanner.plan`), and building them after it (`GraphPlanner.build`: decode
graphs, cuda_graphs.py; piecewise graphs, piecewise_graphs.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from rimuru.dataplane.engine.experts.moe_backend import MoEBackend
from rimuru.dataplane.engine.forward.profile_run import ScratchRunner
from rimuru.dataplane.engine.graphs.cuda_graphs import (
    DecodeGraphs,
    build_decode_graphs,
    capture_sizes,
    graph_memory_bytes,
)
from rimuru.dataplane.engine.graphs.piecewise_graphs import (
    PiecewiseGraphs,
    build_piecewise_graphs,
    graph_driver_bytes,
    piecewise_memory_bytes,
    piecewise_sizes,
)
from rimuru.dataplane.engine.startup.budget import (
    MemoryPlan,
    estimate_activation_bytes,
    plan_memory,
)
from rimuru.dataplane.engine.startup.compute_paths import ComputePaths
from rimuru.dataplane.engine.startup.config import EngineConfig
from rimuru.dataplane.engine.startup.loaded_model import LoadedModel
from rimuru.dataplane.memory.allocator import PageAllocator
from rimuru.dataplane.memory.geometry import BLOCK_SIZE, PageType
from rimuru.dataplane.memory.pool import UnifiedPool
from rimuru.dataplane.model import MoETransformer
from rimuru.dataplane.policies import memory_policy
from rimuru.policy.tunables import EXPERT_MATRICES

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GraphPlan:
    bytes: int  # reserved before the pool for the graphs (0: none captured)
    piecewise: bool  # whether piecewise graphs are built beside the decode graphs


def graph_memory_plan(decode: int, pieces: int, fits: Callable[[int], bool] | None) -> GraphPlan:
    """The plan for decode graphs and piecewise graphs of these sizes. `fits(bytes)`:
    whether the pool still starts with every expert resident beside that much (None: no such
    condition, device copy-in). The decode graphs come first: without room for both, the
    pieces are dropped, then everything."""
    if fits is None or fits(decode + pieces):
        return GraphPlan(decode + pieces, pieces > 0)
    if pieces and fits(decode):
        log.info(
            "piecewise CUDA graphs: off, their %.1f MiB would push experts off", pieces / 2**20
        )
        return GraphPlan(decode, False)
    log.info("CUDA graphs: off, their %.1f MiB would push experts off", decode / 2**20)
    return GraphPlan(0, False)


@dataclass(frozen=True)
class CudaGraphs:
    decode: DecodeGraphs | None  # None: every step runs eagerly
    piecewise: PiecewiseGraphs | None  # None: steps that are no decode graph run eagerly

    @property
    def num_pad_pages(self) -> int:
        """KV pages the decode graphs hold for their padding rows."""
        return len(self.decode.pad_pages) if self.decode is not None else 0


NO_GRAPHS = CudaGraphs(None, None)


class GraphPlanner:
    def __init__(self, config: EngineConfig, loaded: LoadedModel, paths: ComputePaths):
        self.config = config
        self.loaded = loaded
        self.paths = paths

    def uses_graphs(self) -> bool:
        """Decode graphs serve CUDA with the paged Triton kernels, for a policy whose steps
        can be graphs: any with device copy-in; with host copies only while every expert is
        resident (fixed never is; the gather path copies on the host's word)."""
        c = self.config
        return (
            self.loaded.device.type == "cuda"
            and self.paths.use_kernels
            and not c.enforce_eager
            and (memory_policy(c.tunables).graphs_with_host_copies() or c.expert_copy == "device")
            and c.moe_path == "paged"
        )

    def uses_piecewise(self) -> bool:
        """Wherever there are decode graphs: piecewise graphs for the steps they leave
        (cudagraph_mode), if every step can be a graph: device copy-in or the resident
        policy. With host copies an offloaded expert makes a step eager, which then needs
        the activation reserve beside the graphs' memory; those policies keep such steps
        eager instead."""
        c = self.config
        return (
            c.cudagraph_mode == "full_and_piecewise"
            and not self.loaded.config.is_hybrid  # its pieces would cut at GDN layers too
            and (c.expert_copy == "device" or not memory_policy(c.tunables).offloads)
        )

    def decode_sizes(self) -> tuple[int, ...]:
        return capture_sizes(self.config.max_num_seqs)

    def piecewise_sizes(self) -> tuple[int, ...]:
        return piecewise_sizes(self.config.max_num_batched_tokens)

    def max_context(self) -> int:
        return min(self.config.max_seq_len_to_capture, self.loaded.max_model_len)

    def all_experts_fit(self, budget: int, reserve: int, buffers: int) -> bool:
        """Whether the pool left by this plan starts with every expert resident: elastic
        keeps grow_threshold expert pages free (residency.py); resident needs them all."""
        mc, t, geometry = self.loaded.config, self.config.tunables, self.loaded.geometry
        try:
            plan = plan_memory(
                budget, self.loaded.model.resident_nbytes(), reserve, buffers, geometry
            )
        except ValueError:
            return False
        expert_pages = plan.pool_bytes // geometry.bytes_of(PageType.EXPERT)
        margin = memory_policy(t).free_pages_at_start(t)
        return expert_pages - margin >= mc.num_moe_layers * mc.num_experts * EXPERT_MATRICES

    def plan(self, budget: int, reserve: int, buffers: int) -> GraphPlan:
        """The CUDA graphs' memory, planned before the pool (0 bytes when eager): the largest
        decode graph and the largest size's pieces, each captured once on the profiling
        scratch, plus the static inputs and every smaller decode graph's output, plus the
        driver's memory per graph (priced per layer and per piece: cuda_graphs.py,
        piecewise_graphs.py), with 10% headroom as for the activation reserve.

        0 bytes as well when the policy would start with experts offloaded, with or without
        the graphs' memory: no graph could be captured, and the KV keeps that memory. With
        no graphs to plan (CPU, eager), `piecewise` says what the config allows, for
        build(capture=False)."""
        c, loaded = self.config, self.loaded
        if c.cudagraph_mode == "full_and_piecewise" and not self.uses_piecewise():
            log.info(
                "piecewise CUDA graphs: off (they need --expert-copy device or --mode "
                "resident); prompt steps run eagerly"
            )
        if not self.uses_graphs():
            return GraphPlan(0, self.uses_piecewise())
        # device copy-in: graphs whatever the residency, except resident, which never
        # offloads: there graphs must not push an expert off
        device_copy = c.expert_copy == "device" and memory_policy(c.tunables).offloads
        if not device_copy and not self.all_experts_fit(budget, reserve, buffers):
            return GraphPlan(0, False)
        mc, bs = loaded.config, BLOCK_SIZE
        sizes = self.decode_sizes()
        driver, piece_driver = graph_driver_bytes(
            mc.num_layers, c.max_num_seqs, c.max_num_batched_tokens
        )
        pieces = 0
        if mc.is_hybrid:  # the scratch runner drives MoETransformer's pieces: estimated
            largest = estimate_activation_bytes(mc, sizes[-1], sizes[-1], loaded.dtype)
        else:
            scratch = ScratchRunner(
                loaded.model, loaded.host_experts, loaded.geometry, self.paths.moe_kernel(),
                self.paths.attention_kernels(),
            )  # fmt: skip
            largest = graph_memory_bytes(scratch, sizes[-1], bs, self.max_context())
            if self.uses_piecewise():
                # in a pool of their own beside the decode graphs' (piecewise_graphs.py)
                size = self.piecewise_sizes()[-1]
                pool = piecewise_memory_bytes(scratch.runner, scratch.runner.experts, size)
                pieces = int(1.1 * (pool + piece_driver))
            del scratch
            torch.cuda.empty_cache()
        width = -(-self.max_context() // bs)
        num_gdn = len(mc.linear_attention_layers)  # state page ids, SSM and conv, int64
        static = sizes[-1] * (mc.num_kv_layers * (4 * width + 8) + 16 * num_gdn + 8 * 4 + 4)
        outputs = sum(sizes[:-1]) * mc.hidden_size * loaded.geometry.shape.dtype_bytes
        decode = int(1.1 * (largest + static + outputs + driver))
        fits = None
        if not device_copy:

            def fits(extra: int) -> bool:
                return self.all_experts_fit(budget, reserve + extra, buffers)

        return graph_memory_plan(decode, pieces, fits)

    def build(
        self,
        model: MoETransformer,
        experts: MoEBackend,
        allocator: PageAllocator,
        pool: UnifiedPool,
        memory: MemoryPlan,
        graph_plan: GraphPlan,
        *,
        capture: bool = True,
    ) -> CudaGraphs:
        """Build the decode graphs (cuda_graphs.build_decode_graphs), then the piecewise
        graphs (piecewise_graphs.py) where the config, the policy and the memory plan
        (`graph_plan.piecewise`) allow them. `model` is the one behind the pool's backends."""
        decode = build_decode_graphs(
            model, experts, allocator, pool, self.decode_sizes(), self.max_context(),
            BLOCK_SIZE, capture=capture, planned_bytes=memory.cuda_graph_bytes,
        )  # fmt: skip
        piecewise = None
        if decode is not None and graph_plan.piecewise:
            piecewise = build_piecewise_graphs(
                model, experts, self.piecewise_sizes(), capture=capture,
                planned_bytes=memory.cuda_graph_bytes,
            )  # fmt: skip
        return CudaGraphs(decode, piecewise)
