"""Engine set-up decisions: the memory budget, the activation reserve, the loading-buffer
size, start-up residency and which compute path (Triton kernels or torch references)
serves this device. The CUDA graphs' plan is graph_setup.py's.

A mixin of `Engine`: these read the engine's config, device, model and geometry, and are
called once from `Engine.__init__` (the kernel choice also by the profiling forward).
"""

from __future__ import annotations

import logging

import torch

from rimuru.dataplane.engine.budget import (
    device_memory_bytes,
    estimate_activation_bytes,
)
from rimuru.dataplane.engine.config import EngineConfig
from rimuru.dataplane.engine.residency import initial_experts, max_offloaded
from rimuru.dataplane.memory.geometry import MemoryShape, PageGeometry, PageType
from rimuru.dataplane.model.config import ModelConfig
from rimuru.dataplane.model.ops import LayerOps, TorchOps, TritonOps
from rimuru.policy import Tunables

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
        return c.loading_buffer_slots  # >= 1: EngineConfig refuses less
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
        # The copy budget prices only experts resident now that the adjuster evicts later.
        self.copy_control.reset(self.experts.resident_sets(), mc.num_experts)

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
