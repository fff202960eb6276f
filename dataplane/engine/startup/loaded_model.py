"""The model as loaded, before the pool exists: the non-pool weights on the device, every
expert's weights in (pinned) host memory, and the page geometry their shapes imply.

Start-up planning (setup.py, graph_setup.py) reads this and nothing else of the model: the
profiling and warm-up forwards run the backend-less `model` on scratch memory, and the
engine then puts the same weights behind the pool's backends (`MoETransformer.with_backends`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch

from rimuru.dataplane.engine.startup.compute_paths import ComputePaths
from rimuru.dataplane.engine.startup.config import EngineConfig
from rimuru.dataplane.memory.geometry import SSM_STATE_DTYPE_BYTES, MemoryShape, PageGeometry
from rimuru.dataplane.model import MoETransformer
from rimuru.dataplane.model.block_fp8 import scale_shape
from rimuru.dataplane.model.checkpoint import PRESETS, open_weights
from rimuru.dataplane.model.config import ModelConfig, parse_dtype
from rimuru.dataplane.model.hybrid.transformer import HybridTransformer
from rimuru.dataplane.model.ops import LayerOps
from rimuru.dataplane.model.weights import ExpertWeights, WeightSource

_SCALE_ITEMSIZE = 4  # block-FP8 scales are fp32


class RankLink(Protocol):
    """What loading asks of a tensor-parallel rank's link (dataplane/parallel/ implements
    it): its slice of the weights, and ops that sum across ranks."""

    def shard_weights(self, source: WeightSource) -> WeightSource: ...

    def reduce_ops(self, inner: LayerOps | None) -> LayerOps: ...


def page_geometry(mc: ModelConfig, dtype: torch.dtype) -> PageGeometry:
    """Page sizes from the model's shapes; a hybrid's SSM and conv pages hold one GDN
    layer's state of one request. `dtype` is the activations' (KV, conv states); experts
    are in `mc.expert_dtype`."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    ssm = conv = 0
    if mc.is_hybrid:
        gdn = mc.linear_attention
        ssm = math.prod(gdn.ssm_state_shape) * SSM_STATE_DTYPE_BYTES
        conv = math.prod(gdn.conv_state_shape) * itemsize
    return PageGeometry.from_shape(
        MemoryShape(
            mc.num_kv_layers,
            mc.num_experts,
            mc.hidden_size,
            mc.moe_intermediate_size,
            mc.num_kv_heads,
            mc.head_dim,
            itemsize,
            ssm_state_bytes=ssm,
            conv_state_bytes=conv,
            # block FP8: pages of e4m3 bytes (the scales stay outside the pool, geometry.py)
            expert_dtype_bytes=mc.expert_dtype.itemsize if mc.quant is not None else None,
        )
    )


def expert_scale_bytes(mc: ModelConfig) -> int:
    """Block-FP8 experts' fp32 scales, every layer's and expert's: they stay on the device
    outside the pool (memory/geometry.py says why); 0 for unquantized experts."""
    if mc.quant is None:
        return 0
    inter, hidden = mc.moe_intermediate_size, mc.hidden_size
    per_expert = 2 * math.prod(scale_shape(inter, hidden)) + math.prod(scale_shape(hidden, inter))
    return mc.num_moe_layers * mc.num_experts * per_expert * _SCALE_ITEMSIZE


@dataclass(frozen=True)
class LoadedModel:
    config: ModelConfig
    model: MoETransformer | HybridTransformer  # its backends raise until the engine's are set
    host_experts: list[ExpertWeights]  # one per MoE layer, on the host
    geometry: PageGeometry
    dtype: torch.dtype
    device: torch.device
    max_model_len: int  # the config's (at most the model's: check_before_loading), else the model's

    @property
    def non_pool_weight_bytes(self) -> int:
        """Every weight on the device outside the pool: the model's, and block-FP8 experts'
        scales (the MoE backend's)."""
        return self.model.resident_nbytes() + expert_scale_bytes(self.config)


def load_model(
    c: EngineConfig, device: torch.device, tp: RankLink | None = None
) -> tuple[LoadedModel, ComputePaths]:
    """Open the weights (a preset or a checkpoint), put the non-pool ones on `device` and the
    experts on the host, and choose the compute path that will serve them. With `tp`, this
    rank's slice of them, summed across ranks by its ops (dataplane/parallel/)."""
    if c.tensor_parallel_size > 1 and tp is None:
        raise ValueError(
            f"tensor_parallel_size={c.tensor_parallel_size} needs its ranks: build the engine "
            f"with rimuru.dataplane.parallel.launch.start_engine (or engine_builder)"
        )
    skew = c.router_skew if c.model in PRESETS else 0.0
    source = open_weights(c.model, seed=c.seed, router_skew=skew)
    if tp is not None:
        source = tp.shard_weights(source)
    mc = source.config
    dtype = parse_dtype(c.dtype) if c.dtype else mc.dtype
    paths = ComputePaths(c, mc, device)
    ops = paths.layer_ops() if tp is None else tp.reduce_ops(paths.layer_ops())
    unset = _Unset()
    decoder = HybridTransformer if mc.is_hybrid else MoETransformer
    model = decoder.from_source(source, unset, unset, device, dtype, ops)
    pin = device.type == "cuda"
    host_experts = [
        source.expert_weights(layer, dtype, pin_memory=pin, work_device=device)
        for layer in range(mc.num_moe_layers)
    ]
    loaded = LoadedModel(
        config=mc,
        model=model,
        host_experts=host_experts,
        geometry=page_geometry(mc, dtype),
        dtype=dtype,
        device=device,
        max_model_len=c.max_model_len or mc.max_position_embeddings,
    )
    return loaded, paths


class _Unset:
    """Backend placeholder until the pool exists (calling it is a bug)."""

    def attend(self, *args, **kwargs):
        raise RuntimeError("attention backend not set")

    def moe(self, *args, **kwargs):
        raise RuntimeError("expert backend not set")
