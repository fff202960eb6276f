"""The hybrid decoders' own config: which layers are Gated DeltaNet, and the GDN shapes.

Qwen3-Next and Qwen3.5-MoE interleave two token mixers, chosen per layer by `layer_types`
(or, in older configs, every `full_attention_interval`-th layer is full attention):

    linear_attention   Gated DeltaNet: a fixed-size recurrent (SSM) state per request,
                       [Hv, Dk, Dv] fp32, plus a causal-conv state [conv_dim, kernel - 1]
    full_attention     gated attention with a growing KV cache, as in the MoE families

This module is a leaf (config.py and hf_config.py import it); `parse_layer_types` and
`parse_linear_attention` read config.json through the typed reader hf_config.py hands them.

Shape key: Hk/Hv = GDN key/value heads, Dk/Dv = their head dims, K = conv kernel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

LINEAR_ATTENTION = "linear_attention"
FULL_ATTENTION = "full_attention"
LAYER_TYPES = (LINEAR_ATTENTION, FULL_ATTENTION)


@dataclass(frozen=True)
class LinearAttentionConfig:
    """The Gated DeltaNet layer's shapes (config.json's `linear_*` keys)."""

    num_key_heads: int  # Hk
    num_value_heads: int  # Hv; a multiple of Hk, key head h serves value heads h*G..h*G+G-1
    key_head_dim: int  # Dk
    value_head_dim: int  # Dv
    conv_kernel_size: int  # K

    def __post_init__(self) -> None:
        for name in (
            "num_key_heads",
            "num_value_heads",
            "key_head_dim",
            "value_head_dim",
            "conv_kernel_size",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(
                    f"linear attention {name} must be positive, got {getattr(self, name)}"
                )
        if self.num_value_heads % self.num_key_heads:
            raise ValueError(
                f"linear_num_value_heads ({self.num_value_heads}) must be a multiple of "
                f"linear_num_key_heads ({self.num_key_heads})"
            )

    @property
    def key_size(self) -> int:
        return self.num_key_heads * self.key_head_dim

    @property
    def value_size(self) -> int:
        return self.num_value_heads * self.value_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the causal conv: q, k and v side by side (z, b and a skip it)."""
        return 2 * self.key_size + self.value_size

    @property
    def ssm_state_shape(self) -> tuple[int, int, int]:
        return (self.num_value_heads, self.key_head_dim, self.value_head_dim)

    @property
    def conv_state_shape(self) -> tuple[int, int]:
        return (self.conv_dim, self.conv_kernel_size - 1)


class _Reader(Protocol):
    source: str

    def get(self, key: str, default: Any = None) -> Any: ...

    def integer(self, key: str, default: Any = None) -> int: ...


def parse_layer_types(hf: _Reader, num_layers: int) -> tuple[str, ...]:
    """`layer_types` when given, else transformers' rule: layer l is full attention when
    (l + 1) is a multiple of `full_attention_interval` (default 4)."""
    types = hf.get("layer_types")
    if types is None:
        interval = hf.integer("full_attention_interval", 4)
        if interval <= 0:
            raise ValueError(f"{hf.source}: full_attention_interval must be >= 1, got {interval}")
        return tuple(
            FULL_ATTENTION if (i + 1) % interval == 0 else LINEAR_ATTENTION
            for i in range(num_layers)
        )
    if (
        not isinstance(types, list)
        or len(types) != num_layers
        or not set(types) <= set(LAYER_TYPES)
    ):
        raise ValueError(
            f"{hf.source}: layer_types must list one of {list(LAYER_TYPES)} per layer "
            f"({num_layers} layers), got {types!r}"
        )
    return tuple(types)


def parse_linear_attention(hf: _Reader) -> LinearAttentionConfig:
    """The `linear_*` keys; absent ones take transformers' defaults (the published models')."""
    return LinearAttentionConfig(
        num_key_heads=hf.integer("linear_num_key_heads", 16),
        num_value_heads=hf.integer("linear_num_value_heads", 32),
        key_head_dim=hf.integer("linear_key_head_dim", 128),
        value_head_dim=hf.integer("linear_value_head_dim", 128),
        conv_kernel_size=hf.integer("linear_conv_kernel_dim", 4),
    )
