"""Block-wise FP8 checkpoints: the format's math against transformers', config.json's
quantization_config accepted or refused by name, malformed checkpoints named, and what the
loader hands out (FP8 experts with their scales, every other weight dequantized)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers.integrations.finegrained_fp8 import _dequantize_fp8_weight

from rimuru.cli import main
from rimuru.dataplane.model import block_fp8
from rimuru.dataplane.model.checkpoint import (
    PRESETS,
    CheckpointWeights,
    RandomWeights,
    config_from_hf,
    model_config,
)
from rimuru.dataplane.model.checkpoint.loader import CheckpointError
from rimuru.dataplane.model.config import FP8_BLOCK128
from tests.block_fp8_checkpoints import (
    FP8_CONFIG,
    dequantize_blocks,
    quantize_blocks,
    write_fp8_twins,
)


@pytest.fixture(scope="module")
def twins(hf_checkpoints, tmp_path_factory):
    """{family: (fp8 dir, plain dir)} of the tiny transformers models."""
    root = tmp_path_factory.mktemp("fp8")
    return {
        name: write_fp8_twins(hf_checkpoints[name].path, root / name)
        for name in ("qwen2_moe", "qwen3_moe", "mixtral")
    }


def test_quantize_and_dequantize_agree_with_the_tests_and_transformers_math():
    """Partial blocks on both axes (300 x 200); transformers' own dequantization (its
    backward pass's, the one it has that runs on the CPU) in fp32 gives the same values."""
    weight = torch.randn(300, 200, generator=torch.Generator().manual_seed(3)) * 0.05
    q, scale = block_fp8.quantize(weight)
    q_ref, scale_ref = quantize_blocks(weight)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (3, 2) == block_fp8.scale_shape(
        300, 200
    )
    assert torch.equal(scale, scale_ref)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
    ours = block_fp8.dequantize(q, scale, torch.float32)
    assert torch.equal(ours, dequantize_blocks(q, scale))
    theirs = _dequantize_fp8_weight(q, scale, [128, 128], torch.float32)
    assert torch.equal(ours, theirs)
    # e4m3 keeps 3 mantissa bits: each value within 1/16 of its block's largest, relatively
    assert (ours - weight).abs().max() <= weight.abs().max() / 16
    assert block_fp8.dequantize(q, scale, torch.bfloat16).dtype == torch.bfloat16


def _hf(hf_checkpoints, quant=None) -> dict:
    hf = json.loads((hf_checkpoints["qwen3_moe"].path / "config.json").read_text())
    if quant is not None:
        hf["quantization_config"] = quant
    return hf


def test_block_fp8_config_is_recorded(hf_checkpoints):
    assert config_from_hf(_hf(hf_checkpoints)).quant is None
    cfg = config_from_hf(_hf(hf_checkpoints, FP8_CONFIG))
    assert cfg.quant == FP8_BLOCK128 and cfg.expert_dtype == torch.float8_e4m3fn
    listed = {**FP8_CONFIG, "modules_to_not_convert": ["lm_head"]}
    assert config_from_hf(_hf(hf_checkpoints, listed)).quant == FP8_BLOCK128


REFUSED = [
    ({"quant_method": "gptq", "bits": 4}, r"quant_method 'gptq'"),
    ({"quant_method": "awq", "bits": 4}, r"quant_method 'awq'"),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, r"quant_method 'bitsandbytes'"),
    ({"quant_method": "compressed-tensors"}, r"quant_method 'compressed-tensors'"),
    ({"quant_method": "fp8", "activation_scheme": "dynamic"}, r"per-tensor FP8"),
    ({**FP8_CONFIG, "weight_block_size": [64, 64]}, r"\[64, 64\] is not supported until"),
    ({**FP8_CONFIG, "fmt": "e5m2"}, r"FP8 fmt 'e5m2' is not supported"),
    ({**FP8_CONFIG, "activation_scheme": "static"}, r"activation_scheme 'static'"),
]


@pytest.mark.parametrize(("quant", "message"), REFUSED)
def test_other_quantizations_are_refused_by_name_and_exit_2(
    hf_checkpoints, tmp_path, capsys, quant, message
):
    with pytest.raises(ValueError, match=message):
        config_from_hf(_hf(hf_checkpoints, quant))
    (tmp_path / "config.json").write_text(json.dumps(_hf(hf_checkpoints, quant)))
    save_file({"x": torch.zeros(1)}, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=message):
        model_config(str(tmp_path))
    argv = ["generate", "--model", str(tmp_path), "--token-ids", "1,2", "--max-tokens", "2"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip()


def test_compression_config_is_refused(hf_checkpoints):
    hf = {**_hf(hf_checkpoints), "compression_config": {"format": "pack-quantized"}}
    with pytest.raises(ValueError, match="compressed-tensors checkpoint"):
        config_from_hf(hf)


def _rewrite(fp8_dir, tmp_path, change) -> None:
    tensors = load_file(fp8_dir / "model.safetensors")
    change(tensors)
    save_file(tensors, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text((fp8_dir / "config.json").read_text())


_ONE = "model.layers.0.self_attn.q_proj.weight"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda t: t.pop(_ONE + "_scale_inv"), r"has no '.*q_proj.weight_scale_inv' beside it"),
        (
            lambda t: t.update({_ONE + "_scale_inv": torch.ones(2, 2)}),
            r"q_proj.weight_scale_inv' .* needs float scales \(1, 1\)",
        ),
        (
            lambda t: t.update({_ONE: t[_ONE].float().to(torch.float8_e5m2)}),
            r"q_proj.weight' .* is F8_E5M2, but config.json declares fmt 'e4m3'",
        ),
        (
            lambda t: t.update({"model.layers.0.mlp.gate.weight_scale_inv": torch.ones(1, 1)}),
            r"mlp.gate.weight_scale_inv' .* scales no FP8 weight: .* is F32",
        ),
    ],
    ids=["missing-scale", "scale-shape", "e5m2", "orphan-scale"],
)
def test_a_malformed_fp8_checkpoint_is_refused_naming_the_tensor(
    twins, tmp_path, capsys, change, message
):
    _rewrite(twins["qwen3_moe"][0], tmp_path, change)
    with pytest.raises(CheckpointError, match=message):
        CheckpointWeights(tmp_path)
    argv = ["generate", "--model", str(tmp_path), "--token-ids", "1,2", "--max-tokens", "2"]
    assert main(argv) == 2
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("family", ["qwen2_moe", "qwen3_moe", "mixtral"])
def test_experts_stay_fp8_and_the_rest_is_dequantized(twins, family):
    fp8_dir, plain_dir = twins[family]
    fp8, plain = CheckpointWeights(fp8_dir), CheckpointWeights(plain_dir)
    assert fp8.config == plain.config.replace(quant=FP8_BLOCK128)
    for layer in range(fp8.config.num_layers):
        a = fp8.layer_weights(layer, torch.device("cpu"), torch.float32)
        b = plain.layer_weights(layer, torch.device("cpu"), torch.float32)
        assert torch.equal(a.attention.q_proj, b.attention.q_proj)
        assert torch.equal(a.attention.o_proj, b.attention.o_proj)
        assert torch.equal(a.router, b.router)
    for moe_layer in range(fp8.config.num_moe_layers):
        ea, eb = (
            fp8.expert_weights(moe_layer, torch.float32),
            plain.expert_weights(moe_layer, torch.float32),
        )
        assert ea.is_fp8 and ea.w2.dtype == torch.float8_e4m3fn and not eb.is_fp8
        for q, scale, ref in zip(
            (ea.w1, ea.w3, ea.w2),
            (ea.w1_scale, ea.w3_scale, ea.w2_scale),
            (eb.w1, eb.w3, eb.w2),
            strict=True,
        ):
            assert torch.equal(block_fp8.dequantize(q, scale, torch.float32), ref)


def test_fp8_presets_are_their_twins_quantized_block_wise():
    assert PRESETS["tiny-fp8"] == PRESETS["tiny"].replace(quant=FP8_BLOCK128)
    for name in ("qwen3-30b-a3b", "qwen3.5-35b-a3b"):
        assert PRESETS[name + "-fp8"] == PRESETS[name].replace(quant=FP8_BLOCK128)
    fp8 = RandomWeights.preset("tiny-fp8", seed=3).expert_weights(1, torch.float32)
    plain = RandomWeights.preset("tiny", seed=3).expert_weights(1, torch.float32)
    for name in ("w1", "w3", "w2"):
        q, scale = block_fp8.quantize(getattr(plain, name))
        assert torch.equal(getattr(fp8, name).view(torch.uint8), q.view(torch.uint8))
        assert torch.equal(getattr(fp8, name + "_scale"), scale)


def test_tensor_parallel_is_refused_for_fp8_until_ranks_split_the_blocks():
    from rimuru.dataplane.model.checkpoint.shard import check_shardable

    check_shardable(PRESETS["tiny-fp8"], 1)
    with pytest.raises(ValueError, match=r"tensor-parallel-size 2 with a block-FP8 .* not"):
        check_shardable(PRESETS["tiny-fp8"], 2)


def test_bf16_scales_load_as_fp32(twins, tmp_path):
    """Some Qwen3 -FP8 releases store their weight_scale_inv in bf16."""
    fp8_dir, _ = twins["qwen3_moe"]

    def to_bf16(tensors):
        for name in [n for n in tensors if n.endswith("_scale_inv")]:
            tensors[name] = tensors[name].to(torch.bfloat16)

    _rewrite(fp8_dir, tmp_path, to_bf16)
    ours, bf16 = CheckpointWeights(fp8_dir), CheckpointWeights(tmp_path)
    a, b = ours.expert_weights(0, torch.float32), bf16.expert_weights(0, torch.float32)
    assert b.w2_scale.dtype == torch.float32
    assert torch.equal(b.w2_scale, a.w2_scale.to(torch.bfloat16).float())
    cpu = torch.device("cpu")
    q = bf16.layer_weights(0, cpu, torch.float32).attention.q_proj
    assert (
        q.dtype == torch.float32
        and q.shape == ours.layer_weights(0, cpu, torch.float32).attention.q_proj.shape
    )
