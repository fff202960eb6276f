"""Named presets: the public shapes of real MoE models, with seeded random weights.

    name                 family       layers  D     experts  I      top-k  heads (kv)  shared
    tiny                 qwen3_moe    4       128   32       128    4      4 (2)       -
    qwen1.5-moe-a2.7b    qwen2_moe    24      2048  60       1408   4      16 (16)     5632
    qwen3-30b-a3b        qwen3_moe    48      2048  128      768    8      32 (4)      -
    mixtral-8x7b         mixtral      32      4096  8        14336  2      32 (8)      -
    qwen3-next-80b-a3b   qwen3_next   48      2048  512      512    10     16 (2)      512
    qwen3.5-35b-a3b      qwen3_5_moe  40      2048  256      512    8      16 (2)      512
    tiny-hybrid          qwen3_5_moe  4       128   16       128    4      4 (2)       128

`qwen3-30b-a3b-fp8`, `qwen3.5-35b-a3b-fp8` and `tiny-fp8` are those models' block-FP8 twins
(block_fp8.py): the same seeded experts, quantized to e4m3 with one scale per 128 x 128
block, as Qwen's -FP8 releases store them. Their other weights are the twins' own (an -FP8
checkpoint's other linears are dequantized at load, so they serve in the model's dtype).

The last three are hybrids (linear_attention.py). In the real two, 3 of every 4 layers are Gated
DeltaNet (16 key heads, 32 value heads, dims 128, conv kernel 4), the 4th gated attention with
head_dim 256 and a quarter of it rotary. `tiny-hybrid` is their structure shrunk: layers 0-2
Gated DeltaNet (2 key heads, 4 value heads, dims 32), layer 3 gated attention (head_dim 64, 16
rotary dims). RandomWeights builds hybrid layers (HybridLayerWeights) as it builds the others.

`tiny` (the CPU default) and `tiny-hybrid` are CPU-sized: fp32, but with Qwen's vocabulary
(151936) so real Qwen token ids are valid input. The others are bf16 like their checkpoints.

Random weights are generated lazily, one tensor at a time, each from its own generator seeded
by (seed, tensor name): any layer can be produced alone, in any order, on the device it is
needed on and in the dtype it is needed in. Values are identical for the same (seed, device
type, dtype); CPU and CUDA generators produce different numbers.
Scales: norms scale by 1, the router is N(0, 1/D) so that router logits of a normalised input
are about N(0, 1), everything else is N(0, 0.02²) (transformers' initializer_range). Hybrid
models follow transformers' Qwen3-Next / Qwen3.5-MoE init where it differs: their RMSNorms
store w of a (1 + w) scale, so w = 0 (the GDN's gated norm is a plain scale: 1); dt_bias = 1;
A_log = ln U(0.01, 16). The GDN's depthwise conv is N(0, 1/K), unit gain over its K taps
(transformers' 0.02 would shrink v 25-fold before the recurrent state).

Router skew. Random routers spread tokens almost uniformly over experts; trained ones do
not. With skew exponent s >= 0, each layer l draws a seeded random permutation giving every
expert e a popularity rank r_l(e) in 0..E-1, and adds to its router logits the fixed bias

    b_l(e) = -s · ln(1 + r_l(e))

Alone (zero router logits), softmax(b_l) is exactly Zipf's law, p(e) ∝ (1 + r_l(e))^(-s);
on top of the random router it tilts every token's choice the same way, so expert popularity
follows the law approximately and the hottest experts differ from layer to layer. s = 0 adds
no bias (uniform on average).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math

import torch

from rimuru.dataplane.model.block_fp8 import FP8_DTYPE, quantize
from rimuru.dataplane.model.checkpoint.hf_layout import (
    Fetch,
    build_global_weights,
    build_layer_weights,
    is_norm_weight,
    is_router_weight,
)
from rimuru.dataplane.model.checkpoint.hybrid_layout import build_hybrid_layer_weights
from rimuru.dataplane.model.config import FP8_BLOCK128, ModelConfig
from rimuru.dataplane.model.hybrid.weights import HybridLayerWeights
from rimuru.dataplane.model.linear_attention import LinearAttentionConfig
from rimuru.dataplane.model.weights import ExpertWeights, GlobalWeights, LayerWeights, host_empty

_QWEN_VOCAB = 151936
_QWEN_EOS = (151643, 151645)  # <|endoftext|>, <|im_end|>
_STD = 0.02
_GATED_NORM = ".linear_attn.norm.weight"  # the GDN's output norm: a plain scale, not 1 + w
_A_RANGE = (0.01, 16.0)  # A = exp(A_log), the GDN's decay rate: transformers' U(0.01, 16)

_QWEN3_30B_A3B = ModelConfig(
    family="qwen3_moe",
    num_layers=48,
    hidden_size=2048,
    num_heads=32,
    num_kv_heads=4,
    head_dim=128,
    moe_intermediate_size=768,
    num_experts=128,
    top_k=8,
    norm_topk_prob=True,
    shared_expert_intermediate_size=0,
    qkv_bias=False,
    o_bias=False,
    qk_norm=True,
    vocab_size=_QWEN_VOCAB,
    rope_theta=1e6,
    rms_norm_eps=1e-6,
    max_position_embeddings=40960,
    tie_word_embeddings=False,
    bos_token_id=151643,
    eos_token_ids=_QWEN_EOS,
    dtype=torch.bfloat16,
)

# The CPU default: Qwen3-30B-A3B's structure (GQA, q/k norm, renormalised top-k), shrunk.
_TINY = _QWEN3_30B_A3B.replace(
    num_layers=4,
    hidden_size=128,
    num_heads=4,
    num_kv_heads=2,
    head_dim=32,
    moe_intermediate_size=128,
    num_experts=32,
    top_k=4,
    max_position_embeddings=32768,
    tie_word_embeddings=True,  # halves the 151936-row vocabulary's memory, as small Qwen3s do
    dtype=torch.float32,
)

# What tiny-hybrid takes from tiny.
_TINY_SIZES = (
    "num_layers",
    "hidden_size",
    "num_heads",
    "num_kv_heads",
    "moe_intermediate_size",
    "top_k",
    "vocab_size",
    "max_position_embeddings",
    "tie_word_embeddings",
    "bos_token_id",
    "eos_token_ids",
    "dtype",
)

# Qwen3-Next-80B-A3B. Shapes: transformers' Qwen3NextConfig() defaults, which are this model
# (tests/model/test_hybrid_config.py pins them). From the published config.json, where the
# defaults differ or are absent: rope_theta 1e7, max_position_embeddings 262144, bos/eos ids,
# bf16 (values as published on the Hub; not re-read offline).
_QWEN3_NEXT_80B_A3B = ModelConfig(
    family="qwen3_next",
    num_layers=48,
    hidden_size=2048,
    num_heads=16,
    num_kv_heads=2,
    head_dim=256,
    moe_intermediate_size=512,
    num_experts=512,
    top_k=10,
    norm_topk_prob=True,
    shared_expert_intermediate_size=512,
    qkv_bias=False,
    o_bias=False,
    qk_norm=True,
    vocab_size=_QWEN_VOCAB,
    rope_theta=1e7,
    rms_norm_eps=1e-6,
    max_position_embeddings=262144,
    tie_word_embeddings=False,
    bos_token_id=151643,
    eos_token_ids=(151645,),
    dtype=torch.bfloat16,
    # every 4th layer full attention: transformers' default full_attention_interval 4
    layer_types=tuple(
        "full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(48)
    ),
    linear_attention=LinearAttentionConfig(
        num_key_heads=16,
        num_value_heads=32,
        key_head_dim=128,
        value_head_dim=128,
        conv_kernel_size=4,
    ),
    partial_rotary_factor=0.25,
    attn_output_gate=True,
    zero_centred_norms=True,
)

# Qwen3.5-35B-A3B's text model. Shapes: transformers' Qwen3_5MoeTextConfig() defaults, which
# are this model (pinned by the same test): 40 layers, vocab 248320, 256 experts top-8,
# renormalised top-k (its router always renormalises). From the published config.json:
# rope_theta 1e7, max_position_embeddings 262144, eos 248044, no bos, bf16 (as published;
# not re-read offline). Its mrope_section is irrelevant to text: with the three position
# streams equal, interleaved M-RoPE is plain RoPE.
_QWEN3_5_35B_A3B = _QWEN3_NEXT_80B_A3B.replace(
    family="qwen3_5_moe",
    num_layers=40,
    num_experts=256,
    top_k=8,
    vocab_size=248320,
    bos_token_id=None,
    eos_token_ids=(248044,),
    layer_types=tuple(
        "full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(40)
    ),
)

# The CPU hybrid: Qwen3.5-35B-A3B's structure (three Gated DeltaNet layers, then one of gated
# attention with partial RoPE; a shared expert) at `tiny`'s sizes, vocabulary and token ids.
_TINY_HYBRID = _QWEN3_5_35B_A3B.replace(
    **{name: getattr(_TINY, name) for name in _TINY_SIZES},
    head_dim=64,
    num_experts=16,
    shared_expert_intermediate_size=128,
    layer_types=("linear_attention",) * 3 + ("full_attention",),
    linear_attention=dataclasses.replace(  # its conv kernel (4) kept
        _QWEN3_5_35B_A3B.linear_attention,
        num_key_heads=2,
        num_value_heads=4,
        key_head_dim=32,
        value_head_dim=32,
    ),
)

PRESETS: dict[str, ModelConfig] = {
    "tiny": _TINY,
    "qwen1.5-moe-a2.7b": ModelConfig(
        family="qwen2_moe",
        num_layers=24,
        hidden_size=2048,
        num_heads=16,
        num_kv_heads=16,
        head_dim=128,
        moe_intermediate_size=1408,
        num_experts=60,
        top_k=4,
        norm_topk_prob=False,
        shared_expert_intermediate_size=5632,
        qkv_bias=True,
        o_bias=False,
        qk_norm=False,
        vocab_size=_QWEN_VOCAB,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        max_position_embeddings=8192,
        tie_word_embeddings=False,
        bos_token_id=151643,
        eos_token_ids=(151643,),
        dtype=torch.bfloat16,
    ),
    "qwen3-30b-a3b": _QWEN3_30B_A3B,
    "mixtral-8x7b": ModelConfig(
        family="mixtral",
        num_layers=32,
        hidden_size=4096,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        moe_intermediate_size=14336,
        num_experts=8,
        top_k=2,
        norm_topk_prob=True,
        shared_expert_intermediate_size=0,
        qkv_bias=False,
        o_bias=False,
        qk_norm=False,
        vocab_size=32000,
        rope_theta=1e6,
        rms_norm_eps=1e-5,
        max_position_embeddings=32768,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_ids=(2,),
        dtype=torch.bfloat16,
    ),
    "qwen3-next-80b-a3b": _QWEN3_NEXT_80B_A3B,
    "qwen3.5-35b-a3b": _QWEN3_5_35B_A3B,
    "tiny-hybrid": _TINY_HYBRID,
    "qwen3-30b-a3b-fp8": _QWEN3_30B_A3B.replace(quant=FP8_BLOCK128),
    "qwen3.5-35b-a3b-fp8": _QWEN3_5_35B_A3B.replace(quant=FP8_BLOCK128),
    "tiny-fp8": _TINY.replace(quant=FP8_BLOCK128),
}


def preset_config(name: str) -> ModelConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[name]


def zipf_router_bias(num_experts: int, skew: float, seed: int, layer: int) -> torch.Tensor:
    """[E] fp32 bias b(e) = -skew · ln(1 + rank(e)), ranks a seeded permutation per layer."""
    g = torch.Generator().manual_seed(_tensor_seed(seed, f"router_skew.{layer}"))
    rank = torch.randperm(num_experts, generator=g)  # rank[e]: 0 = the hottest expert
    return -skew * torch.log1p(rank.to(torch.float32))


class RandomWeights:
    """WeightSource of seeded random weights at a config's shapes (see the module docstring)."""

    def __init__(self, config: ModelConfig, seed: int = 0, router_skew: float = 0.0) -> None:
        if not (math.isfinite(router_skew) and router_skew >= 0):
            raise ValueError(f"router_skew must be a finite number >= 0, got {router_skew}")
        self._config = config
        self.seed = seed
        self.router_skew = router_skew

    @classmethod
    def preset(cls, name: str, seed: int = 0, router_skew: float = 0.0) -> RandomWeights:
        return cls(preset_config(name), seed=seed, router_skew=router_skew)

    @property
    def config(self) -> ModelConfig:
        return self._config

    def global_weights(self, device: torch.device, dtype: torch.dtype) -> GlobalWeights:
        return build_global_weights(self._config, self._fetcher(device, dtype))

    def layer_weights(
        self, layer: int, device: torch.device, dtype: torch.dtype
    ) -> LayerWeights | HybridLayerWeights:
        fetch = self._fetcher(device, dtype)
        if self._config.is_hybrid:
            weights = build_hybrid_layer_weights(self._config, layer, fetch)
        else:
            weights = build_layer_weights(self._config, layer, fetch)
        if self.router_skew == 0 or weights.router is None:
            return weights
        # Keyed by decoder layer, in hybrid and other models alike.
        bias = zipf_router_bias(self._config.num_experts, self.router_skew, self.seed, layer)
        return dataclasses.replace(weights, router_bias=bias.to(device))

    def expert_weights(
        self,
        moe_layer: int,
        dtype: torch.dtype,
        *,
        pin_memory: bool = False,
        work_device: torch.device | None = None,
    ) -> ExpertWeights:
        cfg = self._config
        cfg.check_moe_layer(moe_layer)
        layer = cfg.moe_layers[moe_layer]  # tensors are seeded by their decoder layer's name
        n, inter, hidden = cfg.num_experts, cfg.moe_intermediate_size, cfg.hidden_size
        work_device = torch.device(work_device or "cpu")
        if cfg.quant is not None:
            return self._fp8_expert_weights(layer, pin_memory, work_device)
        mats = {}
        for name, shape in (
            ("w1", (n, inter, hidden)),
            ("w3", (n, inter, hidden)),
            ("w2", (n, hidden, inter)),
        ):
            host = host_empty(shape, dtype, pin_memory)
            tensor_name = f"model.layers.{layer}.mlp.experts.{name}"
            if work_device.type == "cpu":
                host.normal_(0.0, _STD, generator=self._generator(tensor_name, work_device))
            else:
                host.copy_(self._normal(tensor_name, shape, work_device, dtype))
            mats[name] = host
        return ExpertWeights(**mats)

    def _fp8_expert_weights(
        self, layer: int, pin_memory: bool, work_device: torch.device
    ) -> ExpertWeights:
        """A block-FP8 preset's experts: the seeded weights in the model's dtype, quantized
        block-wise as an -FP8 release's are (on `work_device`, then copied to the host)."""
        cfg = self._config
        n, inter, hidden = cfg.num_experts, cfg.moe_intermediate_size, cfg.hidden_size
        mats = {}
        for name, shape in (
            ("w1", (n, inter, hidden)),
            ("w3", (n, inter, hidden)),
            ("w2", (n, hidden, inter)),
        ):
            tensor_name = f"model.layers.{layer}.mlp.experts.{name}"
            q, scale = quantize(self._normal(tensor_name, shape, work_device, cfg.dtype))
            mats[name] = host_empty(shape, FP8_DTYPE, pin_memory).copy_(q)
            mats[name + "_scale"] = scale.cpu()
        return ExpertWeights(**mats)

    def _fetcher(self, device: torch.device, dtype: torch.dtype) -> Fetch:
        zero_centred = self._config.zero_centred_norms

        def fetch(name: str, shape: tuple[int, ...]) -> torch.Tensor:
            if is_norm_weight(name):
                scale_is_one_plus_w = zero_centred and not name.endswith(_GATED_NORM)
                return torch.full(
                    shape, 0.0 if scale_is_one_plus_w else 1.0, device=device, dtype=dtype
                )
            if name.endswith(".dt_bias"):
                return torch.ones(shape, device=device, dtype=dtype)
            if name.endswith(".A_log"):
                a = torch.empty(shape, device=device, dtype=torch.float32)
                a.uniform_(*_A_RANGE, generator=self._generator(name, torch.device(device)))
                return a.log_().to(dtype)
            # fan-in scaled: the router over D inputs, the depthwise conv over its K taps
            fan_in_scaled = is_router_weight(name) or name.endswith(".conv1d.weight")
            std = shape[-1] ** -0.5 if fan_in_scaled else _STD
            return self._normal(name, shape, device, dtype, std)

        return fetch

    def _normal(
        self,
        name: str,
        shape: tuple[int, ...],
        device: torch.device,
        dtype: torch.dtype,
        std: float = _STD,
    ) -> torch.Tensor:
        out = torch.empty(shape, device=device, dtype=dtype)
        return out.normal_(0.0, std, generator=self._generator(name, torch.device(device)))

    def _generator(self, name: str, device: torch.device) -> torch.Generator:
        return torch.Generator(device=device).manual_seed(_tensor_seed(self.seed, name))


def _tensor_seed(seed: int, name: str) -> int:
    """A stable 63-bit seed per (seed, tensor name); Python's hash() is salted per process."""
    digest = hashlib.sha256(f"{seed}/{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)
