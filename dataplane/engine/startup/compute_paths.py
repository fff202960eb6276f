"""Which compute path serves this engine: the Triton kernels (CUDA by default) or the torch
references (CPU), and the functions each part of the forward calls on that path.

Chosen once from the config and the device; the start-up planners, the expert parts, the
attention backend and the model's layers all ask this one object, so a profiling or warm-up
forward runs exactly the kernels serving will run.
"""

from __future__ import annotations

import torch

from rimuru.dataplane.engine.startup.config import EngineConfig
from rimuru.dataplane.model.config import ModelConfig
from rimuru.dataplane.model.ops import LayerOps, TorchOps, TritonOps


class ComputePaths:
    def __init__(self, config: EngineConfig, model_config: ModelConfig, device: torch.device):
        self.config = config
        self.model_config = model_config
        self.device = device
        self.use_kernels: bool = (
            config.use_kernels if config.use_kernels is not None else device.type == "cuda"
        )
        if model_config.quant is not None and (self.use_kernels or config.moe_path == "gather"):
            # Refused rather than run with the torch MoE behind Triton's other kernels: the
            # profiling forward, graphs and device copy-in assume the fused MoE on that path.
            raise ValueError(
                f"a block-FP8 ({model_config.quant}) model runs only on the torch reference "
                f"path (EngineConfig use_kernels=False, moe_path 'paged') until the fused "
                f"MoE kernel reads FP8 expert pages; serve its BF16 release on a GPU meanwhile"
            )

    def moe_kernel(self):
        """The expert backend's MoE function (None = the torch reference in moe_backend.py)."""
        mc = self.model_config
        if self.config.moe_path == "gather":
            from rimuru.dataplane.engine.experts.moe_gather import (
                make_gather_moe,
                reference_contiguous,
            )

            if self.use_kernels:
                from rimuru.kernels import fused_moe_contiguous

                return make_gather_moe(
                    mc.moe_intermediate_size, mc.hidden_size, fused_moe_contiguous
                )
            return make_gather_moe(mc.moe_intermediate_size, mc.hidden_size, reference_contiguous)
        if not self.use_kernels:
            return None
        from rimuru.kernels import paged_fused_moe  # imported only where Triton runs

        return paged_fused_moe

    def copy_kernel(self):
        """Device copy-in's copy (None = host-driven copies)."""
        if self.config.expert_copy != "device":
            return None
        if self.use_kernels:
            from rimuru.kernels import copy_routed_experts

            return copy_routed_experts
        from rimuru.dataplane.engine.experts.device_copy import copy_routed_experts_torch

        return copy_routed_experts_torch

    def routing_histogram(self):
        """Each MoE layer's tokens per expert, added to its running total (one launch on the
        Triton path; four to five torch launches otherwise)."""
        if self.use_kernels:
            from rimuru.kernels import routing_histogram

            return routing_histogram
        from rimuru.dataplane.engine.experts.routing_histogram import routing_histogram_torch

        return routing_histogram_torch

    def attention_kernels(self):
        if not self.use_kernels:
            return None
        from rimuru.dataplane.engine.forward.paged_attention import triton_attend

        return {"attend": triton_attend}

    def layer_ops(self) -> LayerOps:
        """Norms, RoPE and the router's softmax and top-k: fused Triton kernels wherever the
        other kernels run."""
        return TritonOps() if self.use_kernels and self.config.fused_layer_ops else TorchOps()
