"""Loading local Hugging Face directories: sharded checkpoints and clear errors."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import transformers
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from rimuru.cli import main
from rimuru.dataplane.model.checkpoint import CheckpointWeights, model_config, open_weights
from rimuru.dataplane.model.checkpoint.loader import CheckpointError
from rimuru.dataplane.model.checkpoint.presets import RandomWeights
from tests.model.test_hf_parity import batch_prefill, build

PROMPT = [5, 17, 300, 42, 9, 511, 77]


def test_sharded_checkpoint_loads_the_same_tensors(hf_checkpoints, tmp_path):
    ckpt = hf_checkpoints["qwen2_moe"]
    ckpt.model.save_pretrained(tmp_path, max_shard_size="100KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2  # really sharded
    sharded, single = CheckpointWeights(tmp_path), CheckpointWeights(ckpt.path)
    for layer in range(sharded.config.num_layers):
        a, b = (
            sharded.layer_weights(layer, "cpu", torch.float32),
            single.layer_weights(layer, "cpu", torch.float32),
        )
        assert torch.equal(a.attention.q_bias, b.attention.q_bias)
        assert torch.equal(a.shared_expert.down_proj, b.shared_expert.down_proj)
        ea, eb = (
            sharded.expert_weights(layer, torch.float32),
            single.expert_weights(layer, torch.float32),
        )
        assert torch.equal(ea.w2, eb.w2) and torch.equal(ea.w1, eb.w1)


def _single_file_beside_other_shards(ckpt, path):
    """A directory holding `ckpt`'s model.safetensors and, beside it, the sharded index of a
    model of the same config with other weights: which one a loader reads is visible."""
    torch.manual_seed(99)
    other = type(ckpt.model)(ckpt.model.config).eval()
    # save_pretrained removes an older model.safetensors, so the single file goes in after.
    other.save_pretrained(path, max_shard_size="100KB")
    shutil.copy(ckpt.path / "model.safetensors", path / "model.safetensors")
    assert (path / "model.safetensors.index.json").is_file()
    return other


def _logits(model, prompt=PROMPT) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([prompt])).logits[0]


def test_a_single_file_beside_an_index_is_read_as_transformers_reads_it(hf_checkpoints, tmp_path):
    ckpt = hf_checkpoints["qwen3_moe"]
    other = _single_file_beside_other_shards(ckpt, tmp_path)
    theirs = _logits(transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval())
    # transformers prefers model.safetensors over the index; the two models really differ.
    torch.testing.assert_close(theirs, _logits(ckpt.model), atol=0, rtol=0)
    assert not torch.allclose(theirs, _logits(other), atol=1e-2)
    ours = batch_prefill(build(CheckpointWeights(tmp_path))[0], [PROMPT])
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


def test_config_transformers_weights_picks_the_file_for_both(hf_checkpoints, tmp_path):
    ckpt = hf_checkpoints["qwen3_moe"]
    other = _single_file_beside_other_shards(ckpt, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["transformers_weights"] = "model.safetensors.index.json"
    (tmp_path / "config.json").write_text(json.dumps(config))
    theirs = _logits(transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval())
    torch.testing.assert_close(theirs, _logits(other), atol=0, rtol=0)
    ours = batch_prefill(build(CheckpointWeights(tmp_path))[0], [PROMPT])
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
    for bad, message in [
        ("weights.bin", r"must name a \*\.safetensors file"),
        ("../model.safetensors", "must name a file inside"),
        ("gone.safetensors", "names 'gone.safetensors', which is not in"),
    ]:
        config["transformers_weights"] = bad
        (tmp_path / "config.json").write_text(json.dumps(config))
        with pytest.raises((CheckpointError, FileNotFoundError), match=message):
            CheckpointWeights(tmp_path)


def test_two_unindexed_files_holding_one_tensor_are_refused_naming_both(hf_checkpoints, tmp_path):
    src = hf_checkpoints["mixtral"].path
    shutil.copy(src / "config.json", tmp_path / "config.json")
    shutil.copy(src / "model.safetensors", tmp_path / "a.safetensors")
    shutil.copy(src / "model.safetensors", tmp_path / "b.safetensors")
    with pytest.raises(CheckpointError) as err:
        CheckpointWeights(tmp_path)
    assert "is in both a.safetensors and b.safetensors" in str(err.value)
    assert "no model.safetensors or model.safetensors.index.json" in str(err.value)
    (tmp_path / "b.safetensors").unlink()  # one file of any name is read
    assert CheckpointWeights(tmp_path).config.family == "mixtral"


def test_expert_weights_are_the_hf_matrices_in_page_order(hf_checkpoints):
    ckpt = hf_checkpoints["mixtral"]
    experts = CheckpointWeights(ckpt.path).expert_weights(1, torch.float32)
    assert (experts.w1.shape, experts.w2.shape) == ((8, 32, 64), (8, 64, 32))
    with safe_open(ckpt.path / "model.safetensors", framework="pt") as f:
        w3_of_5 = f.get_tensor("model.layers.1.block_sparse_moe.experts.5.w3.weight")
    assert torch.equal(experts.expert(5)[1], w3_of_5)


def test_dtype_conversion_on_load(hf_checkpoints):
    source = CheckpointWeights(hf_checkpoints["qwen3_moe"].path)
    layer = source.layer_weights(0, "cpu", torch.bfloat16)
    assert layer.attention.q_norm.dtype == torch.bfloat16
    assert source.expert_weights(0, torch.bfloat16).w3.dtype == torch.bfloat16


def test_missing_directory_and_missing_weights(tmp_path, hf_checkpoints):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        CheckpointWeights(tmp_path / "nope")
    shutil.copy(hf_checkpoints["mixtral"].path / "config.json", tmp_path / "config.json")
    with pytest.raises(FileNotFoundError, match=r"no \*\.safetensors"):
        CheckpointWeights(tmp_path)


def test_missing_shard_named_in_the_index(hf_checkpoints, tmp_path):
    hf_checkpoints["mixtral"].model.save_pretrained(tmp_path, max_shard_size="100KB")
    shard = sorted(tmp_path.glob("model-*.safetensors"))[-1]
    shard.unlink()
    with pytest.raises(FileNotFoundError, match=shard.name):
        CheckpointWeights(tmp_path)


def test_missing_tensor_and_wrong_shape_name_the_tensor(hf_checkpoints, tmp_path):
    src = hf_checkpoints["qwen2_moe"].path
    shutil.copy(src / "model.safetensors", tmp_path / "model.safetensors")
    config = json.loads((src / "config.json").read_text())
    # A Qwen3 config over Qwen2 tensors: the q_norm weights do not exist.
    config.update(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe")
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"model\.layers\.0\.self_attn\.q_norm\.weight"):
        CheckpointWeights(tmp_path).layer_weights(0, "cpu", torch.float32)
    config = json.loads((src / "config.json").read_text())
    config["moe_intermediate_size"] = 48
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        ValueError, match=r"has shape \(32, 64\), but config.json implies \(48, 64\)"
    ):
        CheckpointWeights(tmp_path).expert_weights(0, torch.float32)


def test_an_index_naming_a_tensor_its_shard_lacks_exits_2(hf_checkpoints, tmp_path, capsys):
    hf_checkpoints["mixtral"].model.save_pretrained(tmp_path, max_shard_size="100KB")
    index = tmp_path / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    shard = sorted(tmp_path.glob("model-*.safetensors"))[0].name
    data["weight_map"]["model.layers.0.extra.weight"] = shard
    index.write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match=r"maps 'model\.layers\.0\.extra\.weight' to"):
        CheckpointWeights(tmp_path)
    assert main(_generate(tmp_path)) == 2
    err = capsys.readouterr().err
    assert "the index and the shards disagree" in err and "Traceback" not in err


def test_open_weights_dispatches_presets_and_paths(hf_checkpoints):
    assert isinstance(open_weights("tiny", router_skew=1.0), RandomWeights)
    assert open_weights(str(hf_checkpoints["mixtral"].path)).config.family == "mixtral"
    with pytest.raises(ValueError, match="presets only"):
        open_weights(str(hf_checkpoints["mixtral"].path), router_skew=1.0)


def test_a_name_that_is_neither_preset_nor_directory_says_both(tmp_path):
    """`--model qwen3` (a typo of a preset) must not end in FileNotFoundError's traceback."""
    for call in (open_weights, model_config):
        with pytest.raises(ValueError) as err:
            call("qwen3")
        message = str(err.value)
        assert "'qwen3' is neither a preset" in message and "nor a local directory" in message
        assert "tiny" in message and "mixtral-8x7b" in message and "config.json" in message
        with pytest.raises(ValueError, match=r"has no config\.json"):
            call(str(tmp_path))  # an empty directory


def test_open_weights_without_safetensors_is_a_value_error(tmp_path, hf_checkpoints):
    shutil.copy(hf_checkpoints["mixtral"].path / "config.json", tmp_path / "config.json")
    assert model_config(str(tmp_path)).family == "mixtral"  # the config alone is enough
    with pytest.raises(ValueError, match=r"no \*\.safetensors"):
        open_weights(str(tmp_path))


def test_cli_reports_a_wrong_model_without_a_traceback(tmp_path, capsys):
    code = main(["generate", "--model", str(tmp_path / "nope"), "--token-ids", "1"])
    assert code == 2
    assert "is neither a preset" in capsys.readouterr().err


def _copy_checkpoint(src, dst):
    for name in ("config.json", "model.safetensors"):
        shutil.copy(src / name, dst / name)


def _generate(model_dir) -> list[str]:
    return ["generate", "--model", str(model_dir), "--token-ids", "1,2", "--max-tokens", "2"]


def _block_fp8(weight: torch.Tensor, block: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3-style block FP8: e4m3 weights and one fp32 `weight_scale_inv` per block."""
    rows, cols = weight.shape
    blocks = weight.reshape(rows // block, block, cols // block, block)
    scale = blocks.abs().amax(dim=(1, 3)) / 448.0  # [rows/block, cols/block]
    q = (blocks / scale[:, None, :, None]).reshape(rows, cols).to(torch.float8_e4m3fn)
    return q, scale.float()


def test_an_undeclared_or_other_block_fp8_checkpoint_is_refused(hf_checkpoints, tmp_path, capsys):
    """It used to load the e4m3 bytes as floats and generate garbage with exit 0."""
    src = hf_checkpoints["qwen2_moe"].path
    tensors = {}
    for name, t in load_file(src / "model.safetensors").items():
        if name.endswith("proj.weight") and t.dim() == 2:
            t, tensors[name + "_scale_inv"] = _block_fp8(t)
        tensors[name] = t
    save_file(tensors, tmp_path / "model.safetensors")
    config = json.loads((src / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config))  # no quantization_config yet
    with pytest.raises(CheckpointError) as err:
        CheckpointWeights(tmp_path)
    assert "F8_E4M3" in str(err.value) or "weight_scale_inv" in str(err.value)
    assert "quantized checkpoint" in str(err.value)
    config["quantization_config"] = {
        "quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [16, 16],
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    for call in (open_weights, model_config):  # block FP8 loads, but 128 x 128 blocks only
        with pytest.raises(
            ValueError, match=r"weight_block_size \[16, 16\] is not supported until"
        ):
            call(str(tmp_path))
    assert main(_generate(tmp_path)) == 2
    err = capsys.readouterr().err
    assert "[16, 16]" in err and "[128, 128]" in err and "Traceback" not in err


def test_a_truncated_safetensors_file_is_named_and_exits_2(hf_checkpoints, tmp_path, capsys):
    _copy_checkpoint(hf_checkpoints["mixtral"].path, tmp_path)
    shard = tmp_path / "model.safetensors"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])  # an interrupted download
    with pytest.raises(CheckpointError, match=r"model\.safetensors is not a readable safetensors"):
        CheckpointWeights(tmp_path)
    assert main(_generate(tmp_path)) == 2
    err = capsys.readouterr().err
    assert str(shard) in err and "truncated" in err and "Traceback" not in err


def test_a_missing_tensor_is_named_and_exits_2(hf_checkpoints, tmp_path, capsys):
    src = hf_checkpoints["mixtral"].path
    shutil.copy(src / "config.json", tmp_path / "config.json")
    tensors = load_file(src / "model.safetensors")
    missing = "model.layers.1.self_attn.k_proj.weight"
    del tensors[missing]
    save_file(tensors, tmp_path / "model.safetensors")
    assert main(_generate(tmp_path)) == 2
    err = capsys.readouterr().err
    assert f"tensor {missing!r} is missing from the checkpoint in {tmp_path}" in err
    assert "Traceback" not in err
