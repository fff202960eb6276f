"""Hybrid (Gated DeltaNet) configs parse, their presets match transformers' config classes,
and the engine refuses to serve them with the message that says why."""

from __future__ import annotations

import pytest
import torch
import transformers

from rimuru.cli import main
from rimuru.dataplane.model.checkpoint import PRESETS, config_from_hf


# The fields the published config.json sets where transformers' class defaults do not.
def _shapes_only(cfg):
    return cfg.replace(
        rope_theta=1.0,
        max_position_embeddings=1,
        bos_token_id=None,
        eos_token_ids=(),
        dtype=torch.float32,
    )


@pytest.mark.parametrize(
    ("hf_config", "preset"),
    [
        (transformers.Qwen3NextConfig(), "qwen3-next-80b-a3b"),
        (transformers.Qwen3_5MoeConfig(), "qwen3.5-35b-a3b"),  # text_config nested
        (transformers.Qwen3_5MoeTextConfig(), "qwen3.5-35b-a3b"),
    ],
)
def test_transformers_defaults_are_the_presets_shapes(hf_config, preset):
    parsed = config_from_hf(hf_config.to_dict())
    assert _shapes_only(parsed) == _shapes_only(PRESETS[preset])
    assert parsed.is_hybrid


def test_qwen35_preset_is_the_issue_shape():
    cfg = PRESETS["qwen3.5-35b-a3b"]
    gdn = cfg.linear_attention
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (
        40, 2048, 16, 2, 256,
    )  # fmt: skip
    assert cfg.full_attention_layers == tuple(range(3, 40, 4))
    assert (gdn.num_key_heads, gdn.num_value_heads, gdn.key_head_dim, gdn.value_head_dim) == (
        16, 32, 128, 128,
    )  # fmt: skip
    assert (cfg.num_experts, cfg.top_k, cfg.moe_intermediate_size) == (256, 8, 512)
    assert (cfg.shared_expert_intermediate_size, cfg.rotary_dim) == (512, 64)
    # The recurrent state is [Hv, Dk, Dv] fp32 (2 MiB per layer per request); the conv state
    # [conv_dim, K - 1] in the model dtype (bf16: 48 KiB).
    assert gdn.ssm_state_shape == (32, 128, 128)
    assert gdn.conv_state_shape == (8192, 3)
    assert 8192 * 3 * 2 == 48 * 1024
    next80 = PRESETS["qwen3-next-80b-a3b"]
    assert (next80.num_layers, next80.num_experts, next80.top_k, next80.vocab_size) == (
        48, 512, 10, 151936,
    )  # fmt: skip


# The keys of a Qwen3.5-MoE config.json as the Hub lays it out: the text model nested, the
# multimodal wrapper's architecture on top, rope settings in rope_parameters.
QWEN35_NESTED = {
    "architectures": ["Qwen3_5MoeForConditionalGeneration"],
    "model_type": "qwen3_5_moe",
    "tie_word_embeddings": False,
    "text_config": {
        "model_type": "qwen3_5_moe_text",
        "attn_output_gate": True,
        "dtype": "bfloat16",
        "eos_token_id": 248044,
        "full_attention_interval": 4,
        "head_dim": 256,
        "hidden_size": 2048,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
        "linear_value_head_dim": 128,
        "max_position_embeddings": 262144,
        "moe_intermediate_size": 512,
        "num_attention_heads": 16,
        "num_experts": 256,
        "num_experts_per_tok": 8,
        "num_hidden_layers": 40,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06,
        "shared_expert_intermediate_size": 512,
        "vocab_size": 248320,
        "rope_parameters": {
            "mrope_interleaved": True,
            "mrope_section": [11, 11, 10],
            "rope_type": "default",
            "rope_theta": 10000000,
            "partial_rotary_factor": 0.25,
        },
    },
    "vision_config": {"depth": 27, "hidden_size": 1152},
}


def test_nested_text_config_parses_to_the_preset():
    assert config_from_hf(QWEN35_NESTED) == PRESETS["qwen3.5-35b-a3b"]


def test_layer_types_list_wins_over_the_interval():
    hf = transformers.Qwen3NextConfig(
        num_hidden_layers=3, layer_types=["full_attention", "linear_attention", "full_attention"]
    ).to_dict()
    cfg = config_from_hf(hf)
    assert cfg.full_attention_layers == (0, 2)
    assert cfg.is_linear_attention_layer(1) and not cfg.is_linear_attention_layer(0)


def test_qwen3_next_dense_layers_follow_mlp_only_layers():
    cfg = config_from_hf(
        transformers.Qwen3NextConfig(num_hidden_layers=4, mlp_only_layers=[2]).to_dict()
    )
    assert (cfg.dense_layers, cfg.moe_layers, cfg.dense_intermediate_size) == (
        (2,),
        (0, 1, 3),
        5632,
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"attn_output_gate": False}, "attn_output_gate=false"),
        ({"layer_types": ["linear_attention"] * 3}, "one of .* per layer"),
        ({"full_attention_interval": 0}, "full_attention_interval must be >= 1"),
        ({"linear_num_value_heads": 24, "linear_num_key_heads": 16}, "multiple of"),
    ],
)
def test_bad_hybrid_configs_are_refused(change, message):
    hf = dict(QWEN35_NESTED, text_config=dict(QWEN35_NESTED["text_config"], **change))
    with pytest.raises(ValueError, match=message):
        config_from_hf(hf)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("partial_rotary_factor", float("nan"), "partial_rotary_factor must be in (0, 1], got nan"),
        ("partial_rotary_factor", 0, "partial_rotary_factor must be in (0, 1], got 0.0"),
        ("partial_rotary_factor", float("inf"), "partial_rotary_factor must be in (0, 1], got inf"),
        ("rope_theta", float("nan"), "rope_theta must be a finite positive number, got nan"),
        ("rope_theta", -1e6, "rope_theta must be a finite positive number, got -1000000.0"),
    ],
)
def test_non_finite_or_out_of_range_rope_parameters_are_refused_by_name(key, value, message):
    text = QWEN35_NESTED["text_config"]
    rope = dict(text["rope_parameters"], **{key: value})
    hf = dict(QWEN35_NESTED, text_config=dict(text, rope_parameters=rope))
    with pytest.raises(ValueError) as err:
        config_from_hf(hf)
    assert str(err.value) == message


def test_plan_shows_a_hybrid_requests_state_pages(capsys):
    """30 GDN layers x (2 MiB SSM page + 64 KiB conv slot holding 48 KiB) per request, worth
    3168 tokens of KV in the 10 attention layers (20 KiB per token)."""
    assert main(["plan", "--model", "qwen3.5-35b-a3b", "--memory-budget", "80GiB"]) == 0
    out = capsys.readouterr().out
    assert (
        "state pages per request: 30 Gated DeltaNet layers x (SSM page 2.0 MiB + conv page "
        "64.0 KiB slot holding 48.0 KiB) = 61.9 MiB, as much as 3168 tokens of KV in the 10 "
        "attention layers" in out
    )
    assert "conv page 49152 B in a 65536 B slot (16384 B padding, 25.0%)" in out
