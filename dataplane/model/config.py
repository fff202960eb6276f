"""The model's shape and numerics (ModelConfig): what every part of the engine sizes itself by.

The fields are the model's own, validated on construction; hf_config.py parses them from a
Hugging Face `config.json` (five families), presets.py names real models' shapes. Only MoE
layers have routed experts, so every expert-side structure (host experts, pool pages,
hotness ranking, adjuster) counts MoE layers only: MoE layer m is decoder layer
`moe_layers[m]`. The hybrid families (linear_attention.py) add Gated DeltaNet layers and their
per-request state shapes.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch

from rimuru.dataplane.model.linear_attention import LinearAttentionConfig

FAMILIES = ("qwen2_moe", "qwen3_moe", "mixtral", "qwen3_next", "qwen3_5_moe")
HYBRID_FAMILIES = ("qwen3_next", "qwen3_5_moe")

FP8_BLOCK128 = "fp8_block128"
QUANT_FORMATS = (FP8_BLOCK128,)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class ModelConfig:
    """Immutable description of one MoE decoder. Sizes are per layer unless named otherwise."""

    family: str
    num_layers: int
    hidden_size: int  # D
    num_heads: int  # Hq
    num_kv_heads: int  # Hkv; Hq % Hkv == 0 (GQA)
    head_dim: int  # Dh
    moe_intermediate_size: int  # I, one routed expert
    num_experts: int  # E, routed experts per layer
    top_k: int  # K
    norm_topk_prob: bool  # renormalise the top-k softmax probabilities to sum to 1
    shared_expert_intermediate_size: int  # 0 = no shared expert
    qkv_bias: bool
    o_bias: bool
    qk_norm: bool
    vocab_size: int
    rope_theta: float
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    dtype: torch.dtype
    dense_layers: tuple[int, ...] = ()  # decoder layers with a dense MLP instead of experts
    dense_intermediate_size: int = 0  # their MLP size; 0 = no dense layers
    # Hybrid families only (empty / None / 1.0 / False elsewhere):
    layer_types: tuple[str, ...] = ()  # per decoder layer, "linear_attention" / "full_attention"
    linear_attention: LinearAttentionConfig | None = None  # the GDN layers' shapes
    partial_rotary_factor: float = 1.0  # RoPE turns the first rotary_dim of each head
    attn_output_gate: bool = False  # q_proj also yields a sigmoid gate on attention's output
    zero_centred_norms: bool = False  # RMSNorms scale by (1 + w) (gated GDN norm excepted)
    # How the checkpoint stores its linear weights: None = plain floats of `dtype`;
    # FP8_BLOCK128 = float8_e4m3fn with an fp32 scale per 128 x 128 block (block_fp8.py).
    # Routed experts stay FP8 on the host and in the pool; the rest is dequantized at load.
    quant: str | None = None

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"family must be one of {FAMILIES}, got {self.family!r}")
        for name in (
            "num_layers",
            "hidden_size",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "moe_intermediate_size",
            "num_experts",
            "top_k",
            "vocab_size",
            "max_position_embeddings",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        # RoPE divides by powers of rope_theta and RMSNorm adds eps under a square root: a zero,
        # negative or non-finite value yields NaN or inf logits, never an error of its own.
        for name in ("rope_theta", "rms_norm_eps"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite positive number, got {value}")
        # Before rotary_dim is read: int() of a NaN or infinite product raises a bare error.
        if not 0 < self.partial_rotary_factor <= 1:
            raise ValueError(
                f"partial_rotary_factor must be in (0, 1], got {self.partial_rotary_factor}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if self.head_dim % 2 or self.rotary_dim % 2:
            raise ValueError(
                f"head_dim ({self.head_dim}) and its rotary part ({self.rotary_dim}) must be "
                f"even for RoPE"
            )
        self._check_hybrid()
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k ({self.top_k}) cannot exceed num_experts ({self.num_experts})")
        if self.shared_expert_intermediate_size < 0:
            raise ValueError("shared_expert_intermediate_size must be >= 0 (0 = no shared expert)")
        if self.quant is not None and self.quant not in QUANT_FORMATS:
            raise ValueError(f"quant must be None or one of {QUANT_FORMATS}, got {self.quant!r}")
        if self.dtype not in _DTYPES.values():
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {self.dtype}")
        dense = self.dense_layers
        if list(dense) != sorted(set(dense)) or not all(0 <= i < self.num_layers for i in dense):
            raise ValueError(
                f"dense_layers must be distinct ascending layers in 0..{self.num_layers - 1}, "
                f"got {dense}"
            )
        if len(dense) == self.num_layers:
            raise ValueError(
                "every layer is dense (no MoE layer): rimuru serves mixture-of-experts models"
            )
        if dense and self.dense_intermediate_size <= 0:
            raise ValueError(
                f"dense layers {dense} need a positive dense_intermediate_size "
                f"(config.json's intermediate_size), got {self.dense_intermediate_size}"
            )

    def _check_hybrid(self) -> None:
        if self.family not in HYBRID_FAMILIES:
            if self.layer_types or self.linear_attention is not None:
                raise ValueError(f"layer_types/linear_attention are for {HYBRID_FAMILIES} only")
            return
        if len(self.layer_types) != self.num_layers or self.linear_attention is None:
            raise ValueError(
                f"a {self.family} model needs one layer type per layer ({self.num_layers}) and "
                f"its linear_attention shapes"
            )

    @property
    def is_hybrid(self) -> bool:
        """Gated DeltaNet layers beside full attention (Qwen3-Next, Qwen3.5-MoE)."""
        return self.family in HYBRID_FAMILIES

    @property
    def expert_dtype(self) -> torch.dtype:
        """The dtype routed experts are stored in (host and pool): FP8 for a block-FP8
        checkpoint, else the model's."""
        return torch.float8_e4m3fn if self.quant == FP8_BLOCK128 else self.dtype

    @property
    def rotary_dim(self) -> int:
        """The leading dims of each head that RoPE turns (transformers truncates with int())."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def full_attention_layers(self) -> tuple[int, ...]:
        """The decoder layers with attention (all of them unless hybrid)."""
        if not self.layer_types:
            return tuple(range(self.num_layers))
        return tuple(i for i, t in enumerate(self.layer_types) if t == "full_attention")

    @property
    def num_kv_layers(self) -> int:
        """Layers with a KV cache: every layer, or a hybrid's full-attention layers."""
        return len(self.full_attention_layers)

    @property
    def linear_attention_layers(self) -> tuple[int, ...]:
        """A hybrid's Gated DeltaNet layers (each keeps an SSM and a conv state per request)."""
        return tuple(i for i, t in enumerate(self.layer_types) if t == "linear_attention")

    def is_linear_attention_layer(self, layer: int) -> bool:
        self.check_layer(layer)
        return bool(self.layer_types) and self.layer_types[layer] == "linear_attention"

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def has_shared_expert(self) -> bool:
        return self.shared_expert_intermediate_size > 0

    @property
    def moe_layers(self) -> tuple[int, ...]:
        """The decoder layers with routed experts, ascending: MoE layer m is moe_layers[m]."""
        dense = set(self.dense_layers)
        return tuple(i for i in range(self.num_layers) if i not in dense)

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - len(self.dense_layers)

    def is_moe_layer(self, layer: int) -> bool:
        self.check_layer(layer)
        return layer not in self.dense_layers

    def check_layer(self, layer: int) -> None:
        if not 0 <= layer < self.num_layers:
            raise ValueError(
                f"layer {layer} is out of range: the model has {self.num_layers} layers"
            )

    def check_moe_layer(self, moe_layer: int) -> None:
        if not 0 <= moe_layer < self.num_moe_layers:
            raise ValueError(
                f"MoE layer {moe_layer} is out of range: the model has {self.num_moe_layers} "
                f"MoE layers"
            )

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    """`"bfloat16"` / `torch.bfloat16` -> torch.bfloat16, with a clear error otherwise."""
    if isinstance(name, torch.dtype):
        return name
    key = name.removeprefix("torch.")
    if key not in _DTYPES:
        raise ValueError(f"unsupported dtype {name!r}; use one of {sorted(_DTYPES)}")
    return _DTYPES[key]
