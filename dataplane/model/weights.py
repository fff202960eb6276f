"""The weights of one MoE decoder, split the way the engine places them.

Non-expert weights (embeddings, attention, norms, routers, shared experts, the dense MLPs of
dense layers, lm_head) are ordinary tensors that stay resident on the compute device. Routed experts are kept apart in
`ExpertWeights`: host tensors (pinned when serving on CUDA) that back the pool's expert pages.

A `WeightSource` (a checkpoint on disk, or a preset with random weights) hands out these
pieces one layer at a time, so a model larger than host RAM never exists whole in one place.

Shape key: V = vocab, D = hidden, Hq/Hkv = query/KV heads, Dh = head dim,
E = routed experts, I = routed expert size, S = shared expert size, F = dense MLP size.
Matrices use Hugging Face layouts ([out, in]); an expert's three pages are (w1, w3, w2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from rimuru.dataplane.model.block_fp8 import FP8_DTYPE, scale_shape
from rimuru.dataplane.model.config import ModelConfig


@dataclass(frozen=True)
class GlobalWeights:
    embed_tokens: torch.Tensor  # [V, D]
    norm: torch.Tensor  # [D], final RMSNorm
    lm_head: torch.Tensor  # [V, D]; the same tensor as embed_tokens when tied


@dataclass(frozen=True)
class AttentionWeights:
    q_proj: torch.Tensor  # [Hq*Dh, D]
    k_proj: torch.Tensor  # [Hkv*Dh, D]
    v_proj: torch.Tensor  # [Hkv*Dh, D]
    o_proj: torch.Tensor  # [D, Hq*Dh]
    q_bias: torch.Tensor | None = None  # [Hq*Dh]
    k_bias: torch.Tensor | None = None  # [Hkv*Dh]
    v_bias: torch.Tensor | None = None  # [Hkv*Dh]
    o_bias: torch.Tensor | None = None  # [D]
    q_norm: torch.Tensor | None = None  # [Dh], Qwen3 RMSNorm per head
    k_norm: torch.Tensor | None = None  # [Dh]
    # q, k and v stacked [(Hq + 2 Hkv) Dh, D] for one GEMM (MoETransformer fuses them at
    # load, and q/k/v_proj are then views of it); their biases likewise
    qkv_proj: torch.Tensor | None = None
    qkv_bias: torch.Tensor | None = None


@dataclass(frozen=True)
class SharedExpertWeights:
    """Qwen2-MoE's always-on expert, scaled by sigmoid(gate · x)."""

    gate_proj: torch.Tensor  # [S, D]
    up_proj: torch.Tensor  # [S, D]
    down_proj: torch.Tensor  # [D, S]
    gate: torch.Tensor  # [1, D]


@dataclass(frozen=True)
class DenseMLPWeights:
    """A dense layer's gated MLP, in place of the routed experts."""

    gate_proj: torch.Tensor  # [F, D]
    up_proj: torch.Tensor  # [F, D]
    down_proj: torch.Tensor  # [D, F]


@dataclass(frozen=True)
class LayerWeights:
    """An MoE layer has a router (and its experts come from `expert_weights`); a dense
    layer has `dense_mlp` instead. Exactly one of the two is set."""

    input_norm: torch.Tensor  # [D]
    attention: AttentionWeights
    post_attention_norm: torch.Tensor  # [D]
    router: torch.Tensor | None  # [E, D]; None in a dense layer
    router_bias: torch.Tensor | None = None  # [E] fp32, the preset's router skew (None = none)
    shared_expert: SharedExpertWeights | None = None
    dense_mlp: DenseMLPWeights | None = None

    def __post_init__(self) -> None:
        if (self.router is None) == (self.dense_mlp is None):
            raise ValueError("a layer has either a router (MoE) or a dense_mlp, not both/neither")


@dataclass(frozen=True)
class ExpertWeights:
    """One layer's routed experts, stacked: expert e is (w1[e], w3[e], w2[e]).

    Block-FP8 experts (block_fp8.py) are float8_e4m3fn with their fp32 block scales beside
    them; the scales never enter the pool (the MoE reads them by layer and expert id)."""

    w1: torch.Tensor  # [E, I, D] gate_proj
    w3: torch.Tensor  # [E, I, D] up_proj
    w2: torch.Tensor  # [E, D, I] down_proj
    w1_scale: torch.Tensor | None = None  # [E, ceil(I/128), ceil(D/128)] fp32; FP8 only
    w3_scale: torch.Tensor | None = None  # [E, ceil(I/128), ceil(D/128)]
    w2_scale: torch.Tensor | None = None  # [E, ceil(D/128), ceil(I/128)]

    def __post_init__(self) -> None:
        num_experts, inter, hidden = self.w1.shape
        if self.w3.shape != self.w1.shape or self.w2.shape != (num_experts, hidden, inter):
            raise ValueError(
                f"expert shapes disagree: w1 {tuple(self.w1.shape)}, w3 {tuple(self.w3.shape)}, "
                f"w2 {tuple(self.w2.shape)}; expected w1 = w3 = [E, I, D] and w2 = [E, D, I]"
            )
        if not self.w1.dtype == self.w3.dtype == self.w2.dtype:
            raise ValueError("w1, w3 and w2 must share one dtype")
        scales = (self.w1_scale, self.w3_scale, self.w2_scale)
        if self.is_fp8:
            expected = (
                (num_experts, *scale_shape(inter, hidden)),
                (num_experts, *scale_shape(inter, hidden)),
                (num_experts, *scale_shape(hidden, inter)),
            )
            got = tuple(None if t is None else tuple(t.shape) for t in scales)
            if got != expected or any(t.dtype != torch.float32 for t in scales):
                raise ValueError(
                    f"FP8 experts need fp32 block scales of shapes {expected}, got {got}"
                )
        elif any(t is not None for t in scales):
            raise ValueError(f"block scales belong to FP8 experts, not {self.w1.dtype} ones")

    @property
    def is_fp8(self) -> bool:
        return self.w1.dtype == FP8_DTYPE

    def scales(self, e: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Expert e's block scales, in page order (w1, w3, w2); FP8 experts only."""
        if not self.is_fp8:
            raise ValueError(f"{self.w1.dtype} experts have no block scales")
        return self.w1_scale[e], self.w3_scale[e], self.w2_scale[e]

    @property
    def num_experts(self) -> int:
        return self.w1.shape[0]

    def expert(self, e: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The three matrices (pages) of expert e, in page order (w1, w3, w2)."""
        return self.w1[e], self.w3[e], self.w2[e]


class WeightSource(Protocol):
    """Hands out a model's weights piece by piece; every call returns fresh tensors."""

    @property
    def config(self) -> ModelConfig: ...

    def global_weights(self, device: torch.device, dtype: torch.dtype) -> GlobalWeights: ...

    def layer_weights(
        self, layer: int, device: torch.device, dtype: torch.dtype
    ) -> LayerWeights: ...

    def expert_weights(
        self,
        moe_layer: int,
        dtype: torch.dtype,
        *,
        pin_memory: bool = False,
        work_device: torch.device | None = None,
    ) -> ExpertWeights:
        """The routed experts of MoE layer `moe_layer` (decoder layer
        `config.moe_layers[moe_layer]`): host (CPU) tensors, pinned if asked. `work_device`
        may speed up producing them (a preset generates random values there); the result is
        on the host regardless."""
        ...


def host_empty(shape: tuple[int, ...], dtype: torch.dtype, pin_memory: bool) -> torch.Tensor:
    """An uninitialised host tensor, page-locked when asked (only possible with CUDA)."""
    if pin_memory and not torch.cuda.is_available():
        raise ValueError("pin_memory=True needs CUDA; pass pin_memory=False on a CPU-only host")
    return torch.empty(shape, dtype=dtype, pin_memory=pin_memory)
