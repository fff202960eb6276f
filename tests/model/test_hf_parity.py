"""rimuru's model loaded from save_pretrained output matches transformers: logits and greedy tokens."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from rimuru.dataplane.model import (
    ContiguousKVAttention,
    ContiguousKVMeta,
    DenseExperts,
    MoETransformer,
    WeightSource,
)
from rimuru.dataplane.model.checkpoint import CheckpointWeights

FAMILIES = ["qwen2_moe", "qwen3_moe", "mixtral"]
# Dense layers between MoE layers (conftest.py): Qwen2's layers 0 and 2, Qwen3's layer 1.
MIXED = ["qwen2_moe_mixed", "qwen3_moe_mixed"]
PROMPTS = [[5, 17, 300, 42, 9, 511, 77, 1, 250, 3, 64], [100, 2, 33], [7, 7, 7, 7, 8, 480, 12]]


def build(source: WeightSource) -> tuple[MoETransformer, ContiguousKVAttention]:
    attention = ContiguousKVAttention()
    experts = DenseExperts(
        [source.expert_weights(m, torch.float32) for m in range(source.config.num_moe_layers)]
    )
    return MoETransformer.from_source(source, attention, experts, dtype=torch.float32), attention


def batch_prefill(model: MoETransformer, prompts: list[list[int]]) -> torch.Tensor:
    """All prompts in ONE flattened forward; returns the logits of every token, [T, V]."""
    ids = torch.tensor([t for p in prompts for t in p])
    positions = torch.cat([torch.arange(len(p)) for p in prompts])
    meta = ContiguousKVMeta.of([(i, len(p)) for i, p in enumerate(prompts)])
    return model.compute_logits(model.forward(ids, positions, meta))


def greedy(model: MoETransformer, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Batched greedy decoding: one prefill of all prompts, then one token per sequence a step;
    a sequence leaves the batch at EOS, as in transformers' generate."""
    eos = set(model.config.eos_token_ids)
    logits = batch_prefill(model, prompts)
    ends = torch.tensor([len(p) for p in prompts]).cumsum(0) - 1
    outputs = [[int(t)] for t in logits[ends].argmax(-1)]
    for _ in range(max_new_tokens - 1):
        live = [i for i, out in enumerate(outputs) if out[-1] not in eos]
        if not live:
            break
        ids = torch.tensor([outputs[i][-1] for i in live])
        positions = torch.tensor([len(prompts[i]) + len(outputs[i]) - 1 for i in live])
        meta = ContiguousKVMeta.of([(i, 1) for i in live])
        next_ids = model.compute_logits(model.forward(ids, positions, meta)).argmax(-1)
        for i, t in zip(live, next_ids.tolist(), strict=True):
            outputs[i].append(t)
    return outputs


@pytest.mark.parametrize("family", FAMILIES + MIXED)
def test_logits_match_transformers(hf_checkpoints, family):
    ckpt = hf_checkpoints[family]
    model, _ = build(CheckpointWeights(ckpt.path))
    assert model.config.family == family.removesuffix("_mixed")
    ours = batch_prefill(model, PROMPTS)
    start = 0
    for prompt in PROMPTS:
        with torch.no_grad():
            ref = ckpt.model(torch.tensor([prompt])).logits[0]
        torch.testing.assert_close(ours[start : start + len(prompt)], ref, atol=1e-4, rtol=1e-4)
        start += len(prompt)


@pytest.mark.parametrize("family", FAMILIES + MIXED)
def test_greedy_generation_matches_transformers(hf_checkpoints, family):
    ckpt = hf_checkpoints[family]
    model, attention = build(CheckpointWeights(ckpt.path))
    max_new = 12
    ours = greedy(model, PROMPTS, max_new)
    for prompt, generated in zip(PROMPTS, ours, strict=True):
        ref = ckpt.model.generate(
            torch.tensor([prompt]), do_sample=False, max_new_tokens=max_new, attention_mask=None
        )[0, len(prompt) :].tolist()
        assert generated == ref
    # The reference cache holds exactly prompt + generated - 1 tokens (the last was never fed).
    assert attention.num_cached_tokens(0, layer=1) == len(PROMPTS[0]) + len(ours[0]) - 1


def _save_fused(model, path: Path, config_dir: Path) -> None:
    """The transformers-5 in-memory layout (experts.gate_up_proj / experts.down_proj)."""
    path.mkdir()
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        del state["lm_head.weight"]  # safetensors refuses shared storage; tied means absent
    save_file(state, path / "model.safetensors")
    shutil.copy(config_dir / "config.json", path / "config.json")


@pytest.mark.parametrize("family", FAMILIES + MIXED)
def test_fused_expert_layout_loads_the_same_model(hf_checkpoints, family, tmp_path):
    ckpt = hf_checkpoints[family]
    _save_fused(ckpt.model, tmp_path / "fused", ckpt.path)
    fused, classic = CheckpointWeights(tmp_path / "fused"), CheckpointWeights(ckpt.path)
    for layer in range(classic.config.num_moe_layers):
        a = fused.expert_weights(layer, torch.float32)
        b = classic.expert_weights(layer, torch.float32)
        for name in ("w1", "w3", "w2"):
            assert torch.equal(getattr(a, name), getattr(b, name)), (layer, name)
    ours = batch_prefill(build(fused)[0], PROMPTS)
    with torch.no_grad():
        ref = ckpt.model(torch.tensor([PROMPTS[0]])).logits[0]
    torch.testing.assert_close(ours[: len(PROMPTS[0])], ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    ("name", "dense", "moe", "size"),
    [("qwen2_moe_mixed", (0, 2), (1, 3), 128), ("qwen3_moe_mixed", (1,), (0, 2, 3), 96)],
)
def test_mixed_layers_are_laid_out_as_transformers_builds_them(
    hf_checkpoints, name, dense, moe, size
):
    ckpt = hf_checkpoints[name]
    built_dense = tuple(
        i for i, layer in enumerate(ckpt.model.model.layers) if not hasattr(layer.mlp, "gate")
    )
    assert built_dense == dense  # the fixture really has dense layers where we expect them
    source = CheckpointWeights(ckpt.path)
    cfg = source.config
    assert (cfg.dense_layers, cfg.moe_layers, cfg.dense_intermediate_size) == (dense, moe, size)
    assert source.layer_weights(dense[0], "cpu", torch.float32).router is None
    # MoE layer m reads decoder layer moe[m]'s experts
    last = source.expert_weights(len(moe) - 1, torch.float32)
    ref = ckpt.model.model.layers[moe[-1]].mlp.experts
    assert torch.equal(last.w2, ref.down_proj.detach())
    n = len(moe)
    with pytest.raises(ValueError, match=f"MoE layer {n} is out of range: the model has {n} MoE"):
        source.expert_weights(n, torch.float32)
