"""ModelConfig from the config.json of real checkpoints, and the refusals."""

from __future__ import annotations

import json

import pytest
import torch

from rimuru.cli import main
from rimuru.dataplane.model.checkpoint import PRESETS, config_from_hf, load_config

# The public config.json values of the three real models (the keys the parser reads).
QWEN15_MOE_A27B = {
    "architectures": ["Qwen2MoeForCausalLM"],
    "model_type": "qwen2_moe",
    "bos_token_id": 151643,
    "eos_token_id": 151643,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "max_position_embeddings": 8192,
    "max_window_layers": 21,
    "num_attention_heads": 16,
    "num_hidden_layers": 24,
    "num_key_value_heads": 16,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_sliding_window": False,
    "vocab_size": 151936,
    "decoder_sparse_step": 1,
    "moe_intermediate_size": 1408,
    "shared_expert_intermediate_size": 5632,
    "num_experts_per_tok": 4,
    "num_experts": 60,
    "norm_topk_prob": False,
}
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "attention_bias": False,
    "bos_token_id": 151643,
    "decoder_sparse_step": 1,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "max_position_embeddings": 40960,
    "mlp_only_layers": [],
    "moe_intermediate_size": 768,
    "norm_topk_prob": True,
    "num_attention_heads": 32,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 48,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_sliding_window": False,
    "vocab_size": 151936,
}
MIXTRAL_8X7B = {
    "architectures": ["MixtralForCausalLM"],
    "model_type": "mixtral",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "num_attention_heads": 32,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "rms_norm_eps": 1e-05,
    "rope_theta": 1000000.0,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 32000,
}


@pytest.mark.parametrize(
    ("hf", "preset"),
    [
        (QWEN15_MOE_A27B, "qwen1.5-moe-a2.7b"),
        (QWEN3_30B_A3B, "qwen3-30b-a3b"),
        (MIXTRAL_8X7B, "mixtral-8x7b"),
    ],
)
def test_real_configs_parse_to_the_presets(hf, preset):
    parsed = config_from_hf(hf)
    # Qwen3 lists <|im_end|> in config.json and both EOS ids in generation_config.json.
    assert parsed.replace(eos_token_ids=PRESETS[preset].eos_token_ids) == PRESETS[preset]
    assert parsed.eos_token_ids == (hf["eos_token_id"],)


def test_family_specific_fields():
    qwen2 = config_from_hf(QWEN15_MOE_A27B)
    assert (qwen2.qkv_bias, qwen2.qk_norm, qwen2.norm_topk_prob, qwen2.has_shared_expert) == (
        True,
        False,
        False,
        True,
    )
    qwen3 = config_from_hf(QWEN3_30B_A3B)
    assert (qwen3.head_dim, qwen3.q_size, qwen3.kv_size, qwen3.qk_norm) == (128, 4096, 512, True)
    mixtral = config_from_hf(MIXTRAL_8X7B)
    assert (mixtral.norm_topk_prob, mixtral.qkv_bias, mixtral.head_dim) == (True, False, 128)


def test_transformers5_keys_are_read():
    hf = dict(QWEN3_30B_A3B, num_local_experts=64, dtype="float32")
    del hf["num_experts"], hf["rope_theta"], hf["torch_dtype"]
    hf["rope_parameters"] = {"rope_type": "default", "rope_theta": 5e5}
    cfg = config_from_hf(hf)
    assert (cfg.num_experts, cfg.rope_theta, cfg.dtype) == (64, 5e5, torch.float32)


def test_generation_config_eos_ids_are_merged(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_30B_A3B))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [151645, 151643]}))
    assert load_config(tmp_path).eos_token_ids == (151645, 151643)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}, "supported: \\["),
        ({"mlp_only_layers": [0, 48]}, "mlp_only_layers must be a list of layer indices in"),
        ({"mlp_only_layers": "0"}, "mlp_only_layers must be a list"),
        ({"decoder_sparse_step": 0}, "decoder_sparse_step must be >= 1, got 0"),
        ({"mlp_only_layers": list(range(48))}, "every layer is dense"),
        ({"use_sliding_window": True}, "use_sliding_window"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "yarn"),
        ({"hidden_act": "gelu"}, "silu"),
        ({"num_key_value_heads": 5}, "multiple of num_kv_heads"),
        ({"num_experts_per_tok": 200}, "cannot exceed num_experts"),
        ({"torch_dtype": "float64"}, "unsupported dtype"),
    ],
)
def test_unsupported_configs_are_refused_clearly(change, message):
    with pytest.raises(ValueError, match=message):
        config_from_hf(dict(QWEN3_30B_A3B, **change))


@pytest.mark.parametrize("key", ["rope_theta", "rms_norm_eps"])
@pytest.mark.parametrize("value", [0, -1.0, float("nan"), float("inf"), float("-inf")])
def test_non_finite_or_non_positive_rope_and_norm_parameters_are_refused(key, value):
    expected = f"{key} must be a finite positive number, got {float(value)}"
    with pytest.raises(ValueError) as err:
        config_from_hf(dict(QWEN3_30B_A3B, **{key: value}))
    assert str(err.value) == expected
    if key == "rope_theta":  # transformers 5 nests it under rope_parameters
        nested = dict(QWEN3_30B_A3B, rope_parameters={"rope_type": "default", "rope_theta": value})
        del nested["rope_theta"]
        with pytest.raises(ValueError) as err:
            config_from_hf(nested)
        assert str(err.value) == expected


def test_a_zero_rope_theta_exits_2_before_any_weight_is_read(hf_checkpoints, tmp_path, capsys):
    config = json.loads((hf_checkpoints["qwen3_moe"].path / "config.json").read_text())
    config["rope_parameters"]["rope_theta"] = 0
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").write_bytes(b"never read")
    args = ["generate", "--model", str(tmp_path), "--token-ids", "1,2", "--max-tokens", "2"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "rope_theta must be a finite positive number, got 0.0" in err and "Traceback" not in err


def test_mixtral_sliding_window_is_refused_unless_it_covers_the_context():
    with pytest.raises(ValueError, match="sliding_window=4096"):
        config_from_hf(dict(MIXTRAL_8X7B, sliding_window=4096))
    assert config_from_hf(dict(MIXTRAL_8X7B, sliding_window=32768)).num_experts == 8


def test_unknown_architecture_lists_the_supported_ones():
    with pytest.raises(ValueError) as err:
        config_from_hf({"architectures": ["DeepseekV3ForCausalLM"]})
    for arch in ("Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM", "MixtralForCausalLM"):
        assert arch in str(err.value)


def test_missing_config_json_says_what_to_point_at(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        load_config(tmp_path)


def test_a_missing_key_is_named_with_its_file(tmp_path):
    partial = {k: v for k, v in QWEN3_30B_A3B.items() if k != "num_attention_heads"}
    (tmp_path / "config.json").write_text(json.dumps(partial))
    with pytest.raises(ValueError) as err:
        load_config(tmp_path)
    assert "'num_attention_heads'" in str(err.value)
    assert str(tmp_path / "config.json") in str(err.value)


def test_invalid_json_names_the_file_line_and_column(tmp_path):
    (tmp_path / "config.json").write_text(
        '{\n  "hidden_size": 64,\n  "num_attention_heads": 4\n  "x": 1\n}'
    )
    with pytest.raises(ValueError) as err:
        load_config(tmp_path)
    assert str(err.value).startswith(f"{tmp_path / 'config.json'} is not valid JSON: ")
    assert "at line 4, column 3" in str(err.value)


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("num_attention_heads", "four", "an integer, got 'four' (str)"),
        ("num_hidden_layers", 2.5, "an integer, got 2.5 (float)"),
        ("num_experts", True, "an integer, got True (bool)"),
        ("head_dim", [128], "an integer, got [128] (list)"),
        ("rms_norm_eps", "1e-6", "a number, got '1e-6' (str)"),
        ("rope_theta", 10**400, "a finite number, got an integer too large for a float"),
    ],
)
def test_a_field_of_the_wrong_type_is_named_with_its_file(tmp_path, key, value, expected):
    (tmp_path / "config.json").write_text(json.dumps(dict(QWEN3_30B_A3B, **{key: value})))
    with pytest.raises(ValueError) as err:
        load_config(tmp_path)
    assert str(err.value) == f"{tmp_path / 'config.json'}: {key} must be {expected}"


def test_dense_layers_between_moe_layers_follow_transformers_rule():
    """Layer l is dense when listed in mlp_only_layers or when (l + 1) % decoder_sparse_step."""
    cfg = config_from_hf(dict(QWEN15_MOE_A27B, decoder_sparse_step=2, mlp_only_layers=[1]))
    assert cfg.dense_layers == (0, 1, *range(2, 24, 2))
    assert cfg.moe_layers == tuple(range(3, 24, 2))
    assert (cfg.num_moe_layers, cfg.dense_intermediate_size) == (11, 5632)
    qwen3 = config_from_hf(dict(QWEN3_30B_A3B, mlp_only_layers=[0, 47]))
    assert (qwen3.dense_layers, qwen3.num_moe_layers) == ((0, 47), 46)
    assert qwen3.dense_intermediate_size == QWEN3_30B_A3B["intermediate_size"]
    # all MoE: nothing dense, and the dense MLP size is not read
    assert config_from_hf(QWEN3_30B_A3B).dense_layers == ()
    assert config_from_hf(QWEN3_30B_A3B).dense_intermediate_size == 0


@pytest.mark.parametrize(
    ("arch", "reason"),
    [
        ("Glm4MoeForCausalLM", "e_score_correction_bias"),
        ("DeepseekV3ForCausalLM", "multi-head latent attention"),
        ("DeepseekV2ForCausalLM", "multi-head latent attention"),
    ],
)
def test_first_k_dense_architectures_are_refused_with_the_reason(arch, reason):
    with pytest.raises(ValueError) as err:
        config_from_hf(dict(QWEN3_30B_A3B, architectures=[arch], first_k_dense_replace=1))
    assert str(err.value).startswith(f"{arch} is not supported: ")
    assert reason in str(err.value) and "Qwen3MoeForCausalLM" in str(err.value)
