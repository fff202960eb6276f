"""Engine set-up decisions: the memory budget, the activation reserve, the loading-buffer
size, start-up residency, the decode graphs and which compute path (Triton kernels or torch
references) serves this device.

A mixin of `Engine`: these read the engine's config, device, model and geometry, and are
called once from `Engine.__init__` (the kernel choice also by the profiling forward).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from rimuru.dataplane.adjust.tunables import Tunables
from rimuru.dataplane.engine.budget import (
    device_memory_bytes,
    estimate_activation_bytes,
    plan_memory,
)
from rimuru.dataplane.engine.config import EngineConfig
from rimuru.dataplane.engine.cuda_graphs import (
    DecodeGraphs,
    build_decode_graphs,
    capture_sizes,
    graph_memory_bytes,
)
from rimuru.dataplane.engine.piecewise_graphs import (
    build_piecewise_graphs,
    piecewise_memory_bytes,
    piecewise_sizes,
)
from rimuru.dataplane.engine.profile_run import ScratchRunner
from rimuru.dataplane.engine.residency import initial_experts, max_offloaded
from rimuru.dataplane.memory.geometry import MemoryShape, PageGeometry, PageType
from rimuru.dataplane.model.config import ModelConfig
from rimuru.dataplane.model.ops import LayerOps, TorchOps, TritonOps

log = logging.getLogger(__name__)


def page_geometry(mc: ModelConfig, dtype: torch.dtype, block_size: int) -> PageGeometry:
    return PageGeometry.from_shape(
        MemoryShape(
            mc.num_layers,
            mc.num_experts,
            mc.hidden_size,
            mc.moe_intermediate_size,
            mc.num_kv_heads,
            mc.head_dim,
            torch.empty((), dtype=dtype).element_size(),
            block_size,
        )
    )


def buffer_slots(c: EngineConfig, mc: ModelConfig) -> int:
    """Experts per loading buffer: given, or what the policy can leave off a layer."""
    if c.loading_buffer_slots is not None:
        return max(1, c.loading_buffer_slots)
    if c.tunables.mode == "resident":
        return 1
    if c.tunables.mode == "fixed":
        return mc.num_experts  # whatever the share leaves out of one layer
    return max(1, min(mc.num_experts, c.tunables.expert_offload_limit))


def num_loading_buffers(c: EngineConfig) -> int:
    """Host copies alternate two buffers (prefetch into one while the other is read); device
    copy-in copies and computes on one stream, so one buffer serves every layer in turn."""
    return 1 if c.expert_copy == "device" else 2


def loading_buffer_bytes(c: EngineConfig, slots: int, geometry: PageGeometry) -> int:
    return num_loading_buffers(c) * 3 * slots * geometry.expert_page_bytes


def check_buffer_fits(tunables: Tunables, num_experts: int, slots: int) -> None:
    """Elastic: a layer's offloaded experts must all fit one loading buffer (sized at start)."""
    limit = min(tunables.expert_offload_limit, num_experts)
    if tunables.mode == "elastic" and limit > slots:
        raise ValueError(
            f"expert_offload_limit={tunables.expert_offload_limit} exceeds the loading "
            f"buffers' {slots} slots set at start-up: restart with loading_buffer_slots "
            f">= {limit} (--loading-buffer-slots) or keep the limit <= {slots}"
        )


def check_offload_fits(mode: str, offloaded: int, slots: int) -> None:
    """Start-up residency may leave at most one loading buffer's worth off any layer."""
    if offloaded > slots:
        raise ValueError(
            f"the {mode} policy leaves {offloaded} experts of a layer on the host but a "
            f"loading buffer holds {slots}: raise loading_buffer_slots to >= {offloaded} or "
            f"the memory budget"
        )


def graph_memory_plan(
    decode: int, pieces: int, fits: Callable[[int], bool] | None
) -> tuple[int, bool]:
    """(bytes to reserve, whether the piecewise graphs are in) for decode graphs and
    piecewise graphs of these sizes. `fits(bytes)`: whether the pool still starts with every
    expert resident beside that much (None: no such condition, device copy-in). The decode
    graphs come first: without room for both, the pieces are dropped, then everything."""
    if fits is None or fits(decode + pieces):
        return decode + pieces, pieces > 0
    if pieces and fits(decode):
        log.info(
            "piecewise CUDA graphs: off, their %.1f MiB would push experts off", pieces / 2**20
        )
        return decode, False
    log.info("CUDA graphs: off, their %.1f MiB would push experts off", decode / 2**20)
    return 0, False


class EngineSetup:
    def _budget_bytes(self) -> int:
        c = self.config
        if c.memory_budget is not None:
            return c.memory_budget
        if c.gpu_memory_utilization is not None:
            return int(c.gpu_memory_utilization * device_memory_bytes(self.device))
        if self.device.type == "cuda":
            return int(0.9 * device_memory_bytes(self.device))
        # CPU default: everything resident plus room for max_num_seqs short requests
        mc = self.model_config
        experts = mc.num_layers * mc.num_experts * 3 * self.geometry.expert_page_bytes
        return self.model.resident_nbytes() + 2 * experts + 256 * 2**20

    def _activation_reserve(self) -> int:
        """Given, measured by a profiling forward (CUDA, with the serving kernels), or
        estimated (CPU: no peak-memory counter)."""
        c = self.config
        if c.activation_reserve is not None:
            return c.activation_reserve
        if self.device.type == "cuda" and self._use_kernels():
            from rimuru.dataplane.engine.profile_run import (
                measure_activation_bytes,
                prepare_profiling_forward,
            )

            forward = prepare_profiling_forward(
                self.model,
                self.host_experts,
                self.geometry,
                c.max_num_batched_tokens,
                c.max_num_seqs,
                self._moe_kernel(),
                self._attention_kernels(),
            )
            measured = measure_activation_bytes(forward, self.device)
            del forward  # it holds the scratch pool: give that back before the engine's pool
            torch.cuda.empty_cache()
            return int(measured * 1.1)  # 10% headroom for allocator fragmentation
        return estimate_activation_bytes(
            self.model_config, c.max_num_batched_tokens, c.max_num_seqs, self.dtype
        )

    def _warm_up(self) -> None:
        """CUDA with Triton kernels: compile every kernel variant serving will launch now,
        not in the middle of serving (warmup.py)."""
        c = self.config
        if not (c.warmup and self.device.type == "cuda" and self._use_kernels()):
            return
        from rimuru.dataplane.engine.warmup import warm_up, warmup_batches
        from rimuru.kernels import decode_warmup_contexts, fused_moe_variant

        mc = self.model_config

        def moe_key(num_tokens: int):
            return fused_moe_variant(
                num_tokens, mc.top_k, mc.num_experts, mc.moe_intermediate_size, mc.hidden_size,
                self.dtype, self.device,
            )  # fmt: skip

        contexts = decode_warmup_contexts(mc.num_kv_heads, self.max_model_len, self.device)
        batches = warmup_batches(
            c.max_num_batched_tokens, c.max_num_seqs, self.max_model_len, c.block_size,
            moe_key, contexts,
        )  # fmt: skip
        log.info("warm-up: compiling kernels for %d batch shapes before serving", len(batches))
        seconds = warm_up(
            self.model, self.host_experts, self.geometry, batches, self._moe_kernel(),
            self._attention_kernels(),
        )  # fmt: skip
        copy = self._copy_kernel()
        if copy is not None:  # device copy-in: its one variant (nothing routed: no copy)
            w = self.host_experts[0]
            E, inter, hidden = w.w1.shape
            copy(
                torch.zeros(E, dtype=torch.int64, device=self.device),
                torch.full((1,), -1, dtype=torch.int32, device=self.device),
                w.w1, w.w3, w.w2,
                torch.empty(3, inter * hidden, dtype=w.w1.dtype, device=self.device),
                torch.zeros(1, dtype=torch.int32, device=self.device),
            )  # fmt: skip
        torch.cuda.empty_cache()  # the scratch pool goes back before the engine's pool
        log.info("warm-up: %d batch shapes in %.1f s", len(batches), seconds)

    def _uses_graphs(self) -> bool:
        """Decode graphs serve CUDA with the paged Triton kernels, for a policy whose steps
        can be graphs: any with device copy-in; with host copies only while every expert is
        resident (fixed never is; the gather path copies on the host's word)."""
        c = self.config
        return (
            self.device.type == "cuda"
            and self._use_kernels()
            and not c.enforce_eager
            and (c.tunables.mode != "fixed" or c.expert_copy == "device")
            and c.moe_path == "paged"
        )

    def _graph_sizes(self) -> tuple[int, ...]:
        return capture_sizes(self.config.max_num_seqs)

    def _graph_max_context(self) -> int:
        return min(self.config.max_seq_len_to_capture, self.max_model_len)

    def _all_experts_fit(self, budget: int, reserve: int, buffers: int) -> bool:
        """Whether the pool left by this plan starts with every expert resident: elastic
        keeps grow_threshold expert pages free (residency.py); resident needs them all."""
        mc, t = self.model_config, self.config.tunables
        try:
            plan = plan_memory(
                budget, self.model.resident_nbytes(), reserve, buffers, self.geometry
            )
        except ValueError:
            return False
        expert_pages = plan.pool_bytes // self.geometry.bytes_of(PageType.EXPERT)
        margin = t.grow_threshold if t.mode == "elastic" else 0
        return expert_pages - margin >= mc.num_layers * mc.num_experts * t.pages_per_expert

    def _cuda_graph_reserve(self, budget: int, reserve: int, buffers: int) -> int:
        """Bytes the CUDA graphs will keep (0 when eager), planned before the pool: the
        largest decode graph and the largest size's pieces, each captured once on the
        profiling scratch, plus the static inputs and every smaller decode graph's output,
        with 10% headroom as for the activation reserve.

        0 as well when the policy would start with experts offloaded, with or without the
        graphs' memory: no graph could be captured, and the KV keeps that memory. Sets
        `_piecewise_planned`: whether the piecewise graphs' memory made it into the plan."""
        self._piecewise_planned = self._uses_piecewise()
        if not self._uses_graphs():
            return 0
        # device copy-in: graphs whatever the residency, except resident, which never
        # offloads: there graphs must not push an expert off
        c = self.config
        device_copy = c.expert_copy == "device" and c.tunables.mode != "resident"
        if not device_copy and not self._all_experts_fit(budget, reserve, buffers):
            return 0
        mc, bs = self.model_config, self.config.block_size
        sizes = self._graph_sizes()
        scratch = ScratchRunner(
            self.model, self.host_experts, self.geometry, self._moe_kernel(),
            self._attention_kernels(),
        )  # fmt: skip
        largest = graph_memory_bytes(scratch, sizes[-1], bs, self._graph_max_context())
        pieces = 0
        if self._piecewise_planned:
            # The pieces capture into the decode graphs' pool but on a stream of their own,
            # and torch's allocator reuses a block only on the stream that freed it: in
            # effect the two do not share memory, so the plan counts both.
            pieces = piecewise_memory_bytes(
                scratch.runner, scratch.runner.experts, self._piecewise_sizes()[-1]
            )
        del scratch
        torch.cuda.empty_cache()
        width = -(-self._graph_max_context() // bs)
        static = sizes[-1] * (mc.num_layers * (4 * width + 8) + 8 * 4 + 4)
        outputs = sum(sizes[:-1]) * mc.hidden_size * self.geometry.shape.dtype_bytes
        decode = int(1.1 * (largest + static + outputs))
        fits = None
        if not device_copy:

            def fits(extra: int) -> bool:
                return self._all_experts_fit(budget, reserve + extra, buffers)

        planned, self._piecewise_planned = graph_memory_plan(decode, int(1.1 * pieces), fits)
        return planned

    def _uses_piecewise(self) -> bool:
        """Wherever there are decode graphs: piecewise graphs for the steps they leave
        (cudagraph_mode), if every step can be a graph: device copy-in or the resident
        policy. With host copies an offloaded expert makes a step eager, which then needs
        the activation reserve beside the graphs' memory; those policies keep such steps
        eager instead."""
        c = self.config
        return c.cudagraph_mode == "full_and_piecewise" and (
            c.expert_copy == "device" or c.tunables.mode == "resident"
        )

    def _piecewise_sizes(self) -> tuple[int, ...]:
        return piecewise_sizes(self.config.max_num_batched_tokens)

    def _initial_experts(self) -> list[tuple[int, int]]:
        return initial_experts(
            self.tunables,
            self.ranking,
            self.allocator.num_free(PageType.EXPERT),
            self.config.fixed_expert_share,
        )

    def _check_buffer_fits(self, tunables: Tunables) -> None:
        mc = self.model_config
        check_buffer_fits(tunables, mc.num_experts, self.experts.num_buffer_slots)

    def _load_initial_experts(self) -> None:
        chosen = self._initial_experts()
        mc = self.model_config
        offloaded = max_offloaded(chosen, mc.num_layers, mc.num_experts)
        check_offload_fits(self.tunables.mode, offloaded, self.experts.num_buffer_slots)
        self.experts.load_initial(chosen, self.tunables.pages_per_expert)

    def make_decode_graphs(self, *, capture: bool = True) -> DecodeGraphs | None:
        """Build (cuda_graphs.build_decode_graphs) and adopt the decode graphs, then the
        piecewise graphs (piecewise_graphs.py) where the config, the policy and the memory
        plan allow them."""
        self.graphs = build_decode_graphs(
            self.model, self.experts, self.allocator, self.pool, self._graph_sizes(),
            self._graph_max_context(), self.config.block_size, capture=capture,
            planned_bytes=self.plan.cuda_graph_bytes,
        )  # fmt: skip
        if self.graphs is not None and self._piecewise_planned:
            # the decode graphs' pool handle (see _cuda_graph_reserve: no memory shared)
            self.piecewise = build_piecewise_graphs(
                self.model, self.experts, self._piecewise_sizes(), capture=capture,
                pool=self.graphs.pool, planned_bytes=self.plan.cuda_graph_bytes,
            )  # fmt: skip
        return self.graphs

    def _num_graph_pad_pages(self) -> int:
        return len(self.graphs.pad_pages) if self.graphs is not None else 0

    def _buffer_slots(self) -> int:
        return buffer_slots(self.config, self.model_config)

    def _moe_kernel(self):
        mc = self.model_config
        if self.config.moe_path == "gather":
            from rimuru.dataplane.engine.moe_gather import make_gather_moe, reference_contiguous

            if self._use_kernels():
                from rimuru.kernels import fused_moe_contiguous

                return make_gather_moe(
                    mc.moe_intermediate_size, mc.hidden_size, fused_moe_contiguous
                )
            return make_gather_moe(mc.moe_intermediate_size, mc.hidden_size, reference_contiguous)
        if not self._use_kernels():
            return None
        from rimuru.kernels import paged_fused_moe  # imported only where Triton runs

        return paged_fused_moe

    def _copy_kernel(self):
        """Device copy-in's copy (None = host-driven copies)."""
        if self.config.expert_copy != "device":
            return None
        if self._use_kernels():
            from rimuru.kernels import copy_routed_experts

            return copy_routed_experts
        from rimuru.dataplane.engine.device_copy import copy_routed_experts_torch

        return copy_routed_experts_torch

    def _attention_kernels(self):
        if not self._use_kernels():
            return None
        from rimuru.dataplane.engine.paged_attention import triton_attend

        return {"attend": triton_attend}

    def _layer_ops(self) -> LayerOps:
        """Norms and RoPE: fused Triton kernels wherever the other kernels run."""
        return TritonOps() if self._use_kernels() and self.config.fused_layer_ops else TorchOps()

    def _use_kernels(self) -> bool:
        if self.config.use_kernels is not None:
            return self.config.use_kernels
        return self.device.type == "cuda"
