"""The model's shape and numerics, parsed from a Hugging Face `config.json`.

Five families parse; each key below is what that family's `config.json` calls it:

    family       experts                      expert size              attention
    qwen2_moe    num_experts + shared expert  moe_intermediate_size    q/k/v biases
    qwen3_moe    num_experts (or num_local_)  moe_intermediate_size    q/k RMSNorm per head
    mixtral      num_local_experts            intermediate_size        plain
    qwen3_next   num_experts + shared expert  moe_intermediate_size    hybrid, see below
    qwen3_5_moe  num_experts + shared expert  moe_intermediate_size    hybrid, see below

The two hybrid families (hybrid_config.py) mix Gated DeltaNet layers with gated full
attention: the attention's q_proj also yields a sigmoid output gate, its q/k norms and every
decoder RMSNorm scale by (1 + w) (zero-centred weights), and RoPE turns only the first
`partial_rotary_factor` of each head. Qwen3.5-MoE's config.json nests the text model under
`text_config` (the multimodal wrapper's); that is what is parsed.

The Qwen families may interleave dense layers (a plain gated MLP of `intermediate_size`)
with MoE layers, as transformers decides: layer l is dense when it is in `mlp_only_layers` or
(l + 1) is not a multiple of `decoder_sparse_step`. Only MoE layers have routed experts, so
every expert-side structure (host experts, pool pages, hotness ranking, adjuster) counts MoE
layers only: MoE layer m is decoder layer `moe_layers[m]`.

Anything the model does not implement (sliding windows, scaled RoPE, activations other than
SiLU, quantized weights, architectures such as DeepSeek-V3 or GLM-4.5 whose attention or
routing differ) is refused with an error that names the key or the architecture, so a
checkpoint never runs with silently different math.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rimuru.dataplane.model.hybrid_config import (
    LinearAttentionConfig,
    parse_layer_types,
    parse_linear_attention,
)

FAMILIES = ("qwen2_moe", "qwen3_moe", "mixtral", "qwen3_next", "qwen3_5_moe")
HYBRID_FAMILIES = ("qwen3_next", "qwen3_5_moe")

# HF `architectures[0]` -> family; `model_type` is accepted too.
_ARCHITECTURES = {
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "MixtralForCausalLM": "mixtral",
    "Qwen3NextForCausalLM": "qwen3_next",
    "Qwen3_5MoeForCausalLM": "qwen3_5_moe",  # the text model alone (model_type ..._text)
    "Qwen3_5MoeForConditionalGeneration": "qwen3_5_moe",  # the published checkpoints
}
# model_type values that name a family under another name.
_MODEL_TYPES = {"qwen3_5_moe_text": "qwen3_5_moe"}

# Known MoE architectures the model does not implement, and why (their first_k_dense_replace
# dense layers alone would fit the dense-layer support; the rest does not).
_UNSUPPORTED_ARCHITECTURES = {
    "DeepseekV2ForCausalLM": "multi-head latent attention (kv_lora_rank) is not implemented",
    "DeepseekV3ForCausalLM": "multi-head latent attention (kv_lora_rank) and sigmoid "
    "group-limited routing (n_group/topk_group, e_score_correction_bias) are not implemented",
    "Glm4MoeForCausalLM": "its sigmoid group-limited routing (e_score_correction_bias, "
    "n_group/topk_group, routed_scaling_factor) and partial rotary embeddings "
    "(partial_rotary_factor) are not implemented",
}

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
        if not 0 < self.partial_rotary_factor <= 1:
            raise ValueError(
                f"partial_rotary_factor must be in (0, 1], got {self.partial_rotary_factor}"
            )
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


def load_config(model_dir: str | Path) -> ModelConfig:
    """Read `config.json` (and `generation_config.json`'s EOS ids, if present) from a directory."""
    model_dir = Path(model_dir)
    path = model_dir / "config.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found: point at a Hugging Face model directory containing config.json"
        )
    hf = read_json(path)
    extra_eos: tuple[int, ...] = ()
    gen_path = model_dir / "generation_config.json"
    if gen_path.is_file():
        extra_eos = _as_ids(read_json(gen_path).get("eos_token_id"))
    config = config_from_hf(hf, source=str(path))
    merged = config.eos_token_ids + tuple(i for i in extra_eos if i not in config.eos_token_ids)
    return config.replace(eos_token_ids=merged)


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from `path`; a syntax error names the file, line and column."""
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"{path} is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}"
        ) from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path} is not UTF-8 text ({exc.reason}): is it a JSON file?") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} holds a JSON {type(data).__name__}, not an object")
    return data


def config_from_hf(hf: dict[str, Any], *, source: str = "config.json") -> ModelConfig:
    """Parse the dict of a Hugging Face `config.json` (`source` names it in errors); refuse
    what the model does not implement."""
    try:
        return _parse(_Keys(_text_config(hf), source))
    except KeyError as exc:  # only the keys every family must have are read with hf[...]
        raise ValueError(
            f"{source} lacks {exc.args[0]!r}, which a {hf.get('model_type') or 'MoE'} model "
            f"needs: is this a complete Hugging Face config.json?"
        ) from None


def _text_config(hf: dict[str, Any]) -> dict[str, Any]:
    """A multimodal wrapper's (Qwen3.5-MoE's) text model: its `text_config` keys over the
    top level's (which keep `architectures`, and `tie_word_embeddings` when text omits it)."""
    text = hf.get("text_config")
    if not isinstance(text, dict):
        return hf
    outer = {k: v for k, v in hf.items() if k not in ("text_config", "vision_config")}
    return {**outer, **text}


class _Keys(dict):
    """config.json's dict, with typed reads whose errors name the key and its file."""

    def __init__(self, hf: dict[str, Any], source: str) -> None:
        super().__init__(hf)
        self.source = source

    def integer(self, key: str, default: Any = None) -> int:
        """hf[key] (or `default` when absent or null) as an int; KeyError when required."""
        value = self[key] if default is None else self.get(key)
        if value is None:
            value = default
        # bool is an int in Python, never in a config; a float like 4.0 is not a count.
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(
                f"{self.source}: {key} must be an integer, got {value!r} ({type(value).__name__})"
            )
        return value

    def number(self, key: str, default: float) -> float:
        value = self.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(
                f"{self.source}: {key} must be a number, got {value!r} ({type(value).__name__})"
            )
        return float(value)


def _parse(hf: _Keys) -> ModelConfig:
    family = _family(hf)
    _refuse_unsupported(hf, family)
    num_heads = hf.integer("num_attention_heads")
    hidden = hf.integer("hidden_size")
    num_kv_heads = hf.integer("num_key_value_heads", num_heads)
    head_dim = hf.integer("head_dim", hidden // num_heads if num_heads > 0 else 0)
    if family == "mixtral":
        num_experts = hf.integer("num_local_experts")
        expert_size = hf.integer("intermediate_size")
    else:
        # transformers 5 writes Qwen3-MoE's count as num_local_experts; real checkpoints say num_experts.
        key = "num_experts" if hf.get("num_experts") is not None else "num_local_experts"
        if hf.get(key) is None:
            raise ValueError(f"{hf.source} of a {family} model lacks num_experts")
        num_experts = hf.integer(key)
        expert_size = hf.integer("moe_intermediate_size")
    dense = _dense_layers(hf, family)
    hybrid = family in HYBRID_FAMILIES
    num_layers = hf.integer("num_hidden_layers")
    return ModelConfig(
        family=family,
        num_layers=num_layers,
        hidden_size=hidden,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        moe_intermediate_size=expert_size,
        num_experts=num_experts,
        top_k=hf.integer("num_experts_per_tok"),
        # Mixtral always renormalises its top-2; the Qwen families say so in norm_topk_prob.
        norm_topk_prob=_norm_topk_prob(hf, family),
        shared_expert_intermediate_size=hf.integer("shared_expert_intermediate_size", 0)
        if family in ("qwen2_moe", *HYBRID_FAMILIES)
        else 0,
        qkv_bias=_qkv_bias(hf, family),
        o_bias=family != "qwen2_moe"
        and family != "mixtral"
        and bool(hf.get("attention_bias", False)),
        qk_norm=family == "qwen3_moe" or hybrid,
        vocab_size=hf.integer("vocab_size"),
        rope_theta=_rope_theta(hf, family),
        rms_norm_eps=hf.number("rms_norm_eps", 1e-6),
        max_position_embeddings=hf.integer("max_position_embeddings"),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        bos_token_id=hf.get("bos_token_id"),
        eos_token_ids=_as_ids(hf.get("eos_token_id")),
        dtype=parse_dtype(hf.get("dtype") or hf.get("torch_dtype") or "float32"),
        dense_layers=dense,
        dense_intermediate_size=hf.integer("intermediate_size") if dense else 0,
        layer_types=parse_layer_types(hf, num_layers) if hybrid else (),
        linear_attention=parse_linear_attention(hf) if hybrid else None,
        partial_rotary_factor=_partial_rotary_factor(hf) if hybrid else 1.0,
        attn_output_gate=hybrid,
        zero_centred_norms=hybrid,
    )


def _norm_topk_prob(hf: _Keys, family: str) -> bool:
    # Mixtral and Qwen3.5-MoE always renormalise their top-k (the latter's config has no key);
    # Qwen3-Next's transformers default is True, the older Qwen families' False.
    if family in ("mixtral", "qwen3_5_moe"):
        return True
    return bool(hf.get("norm_topk_prob", family == "qwen3_next"))


def _partial_rotary_factor(hf: _Keys) -> float:
    """rope_parameters' value (transformers 5), else the top-level key; 0.25 when absent,
    transformers' default for both hybrid families."""
    params = hf.get("rope_parameters") or {}
    if "partial_rotary_factor" in params:
        return _Keys(params, f"{hf.source} rope_parameters").number("partial_rotary_factor", 0.25)
    return hf.number("partial_rotary_factor", 0.25)


def _dense_layers(hf: _Keys, family: str) -> tuple[int, ...]:
    """The layers transformers builds with a dense MLP (Qwen2/Qwen3-MoE's decoder layer)."""
    if family in ("mixtral", "qwen3_5_moe"):  # Qwen3.5-MoE: every layer is MoE
        return ()
    num_layers = hf.integer("num_hidden_layers")
    step = hf.integer("decoder_sparse_step", 1)
    if step <= 0:
        raise ValueError(f"{hf.source}: decoder_sparse_step must be >= 1, got {step}")
    only = hf.get("mlp_only_layers") or []
    if not isinstance(only, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) and 0 <= i < num_layers for i in only
    ):
        raise ValueError(
            f"{hf.source}: mlp_only_layers must be a list of layer indices in "
            f"0..{num_layers - 1}, got {only!r}"
        )
    return tuple(i for i in range(num_layers) if i in only or (i + 1) % step != 0)


def _family(hf: dict[str, Any]) -> str:
    architectures = hf.get("architectures") or []
    for arch in architectures:
        if arch in _ARCHITECTURES:
            return _ARCHITECTURES[arch]
        if arch in _UNSUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"{arch} is not supported: {_UNSUPPORTED_ARCHITECTURES[arch]}; supported: "
                f"{sorted(_ARCHITECTURES)}"
            )
    model_type = _MODEL_TYPES.get(hf.get("model_type"), hf.get("model_type"))
    if model_type in FAMILIES:
        return model_type
    raise ValueError(
        f"unsupported architecture {architectures or hf.get('model_type')!r}; "
        f"supported: {sorted(_ARCHITECTURES)} (model_type {list(FAMILIES)})"
    )


def _refuse_unsupported(hf: _Keys, family: str) -> None:
    _refuse_quantized(hf)
    if hf.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act {hf['hidden_act']!r} is not supported; only 'silu' is")
    if family in HYBRID_FAMILIES and hf.get("attn_output_gate", True) is not True:
        raise ValueError("attn_output_gate=false is not supported; the hybrid models gate it")
    if family != "mixtral":
        if hf.get("use_sliding_window"):
            raise ValueError("use_sliding_window=true is not supported; set it to false")
    else:
        window = hf.get("sliding_window")
        if window is not None and window < hf["max_position_embeddings"]:
            raise ValueError(
                f"sliding_window={window} is not supported; set it to null (full attention)"
            )
    scaling = hf.get("rope_scaling") or hf.get("rope_parameters") or {}
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type != "default":
        raise ValueError(f"RoPE type {rope_type!r} is not supported; only 'default' RoPE is")


def _refuse_quantized(hf: _Keys) -> None:
    """The model computes with plain float weights: a quantized checkpoint's weights (FP8
    with block scales, GPTQ/AWQ ints, ...) read as floats are garbage, so refuse them."""
    for key in ("quantization_config", "compression_config"):
        quant = hf.get(key)
        if quant:
            method = quant.get("quant_method") if isinstance(quant, dict) else None
            raise ValueError(
                f"{hf.source} declares a quantized checkpoint ({key} with quant_method "
                f"{method!r}); rimuru loads unquantized float32/bfloat16/float16 weights only: "
                f"use the model's unquantized (e.g. BF16) release"
            )


def _rope_theta(hf: _Keys, family: str) -> float:
    params = hf.get("rope_parameters") or {}
    default = 1e6 if family == "mixtral" else 10000.0  # transformers' defaults per family
    if "rope_theta" in params:
        return _Keys(params, f"{hf.source} rope_parameters").number("rope_theta", default)
    return hf.number("rope_theta", default)


def _qkv_bias(hf: dict[str, Any], family: str) -> bool:
    if family == "qwen2_moe":
        return bool(hf.get("qkv_bias", True))  # Qwen1.5-MoE checkpoints predate the key
    if family == "mixtral":
        return False
    return bool(hf.get("attention_bias", False))


def _as_ids(value: int | list[int] | None) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)
