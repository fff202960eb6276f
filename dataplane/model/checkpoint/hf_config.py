"""A Hugging Face `config.json` parsed into a ModelConfig (config.py).

Five families parse; each key below is what that family's `config.json` calls it:

    family       experts                      expert size              attention
    qwen2_moe    num_experts + shared expert  moe_intermediate_size    q/k/v biases
    qwen3_moe    num_experts (or num_local_)  moe_intermediate_size    q/k RMSNorm per head
    mixtral      num_local_experts            intermediate_size        plain
    qwen3_next   num_experts + shared expert  moe_intermediate_size    hybrid, see below
    qwen3_5_moe  num_experts + shared expert  moe_intermediate_size    hybrid, see below

The two hybrid families (linear_attention.py) mix Gated DeltaNet layers with gated full
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
SiLU, quantized weights other than block-wise FP8, architectures such as DeepSeek-V3 or
GLM-4.5 whose attention or routing differ) is refused with an error that names the key or the architecture, so a
checkpoint never runs with silently different math.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rimuru.dataplane.model.block_fp8 import BLOCK
from rimuru.dataplane.model.config import (
    FAMILIES,
    FP8_BLOCK128,
    HYBRID_FAMILIES,
    ModelConfig,
    parse_dtype,
)
from rimuru.dataplane.model.linear_attention import parse_layer_types, parse_linear_attention

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
        try:
            return float(value)
        except OverflowError:  # a JSON integer of hundreds of digits
            raise ValueError(
                f"{self.source}: {key} must be a finite number, got an integer too large for a "
                f"float"
            ) from None


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
        quant=_quant(hf),
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


def _quant(hf: _Keys) -> str | None:
    """The weight format config.json declares: None (plain floats) or FP8_BLOCK128. Every
    other quantization (GPTQ/AWQ ints, bitsandbytes, per-tensor FP8, compressed-tensors,
    other block sizes) is refused by name: its weights read as floats would be garbage."""
    if hf.get("compression_config"):
        raise ValueError(
            f"{hf.source} declares a compressed-tensors checkpoint (compression_config), which "
            f"rimuru does not load; {_SERVED_FORMATS}"
        )
    quant = hf.get("quantization_config")
    if not quant:
        return None
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    if method != "fp8":
        raise ValueError(
            f"{hf.source} declares a quantized checkpoint (quantization_config with quant_method "
            f"{method!r}), which rimuru does not load; {_SERVED_FORMATS}"
        )
    block = quant.get("weight_block_size")
    if block is None:
        raise ValueError(
            f"{hf.source} declares per-tensor FP8 (quant_method 'fp8' without "
            f"weight_block_size), which rimuru does not load; {_SERVED_FORMATS}"
        )
    # the fused-MoE kernels to come tile by 128, as vLLM's block-FP8 path does
    served = {"fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [BLOCK, BLOCK]}
    for key, want in served.items():
        got = quant.get(key, want)
        if got != want:
            raise ValueError(
                f"{hf.source}: FP8 {key} {got!r} is not supported until rimuru computes with "
                f"it; only {want!r} is"
            )
    return FP8_BLOCK128


_SERVED_FORMATS = (
    "it serves unquantized float32/bfloat16/float16 weights and block-wise FP8 (quant_method "
    "'fp8', fmt 'e4m3', weight_block_size [128, 128]): use such a release (e.g. the BF16 or "
    "-FP8 one)"
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
