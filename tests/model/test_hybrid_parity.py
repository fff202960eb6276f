"""The hybrid reference forward, loaded through CheckpointWeights from save_pretrained output,
matches transformers' Qwen3-Next and Qwen3.5-MoE: prompt logits and greedy tokens."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from rimuru.dataplane.model.checkpoint import CheckpointWeights
from rimuru.dataplane.model.hybrid.reference import HybridReference

# A 70-token prompt crosses the chunked rule's 64-token chunk boundary.
PROMPTS = [[(37 * i + 11) % 512 for i in range(70)], [5, 17, 300, 42, 9, 511, 77], [100]]


@pytest.fixture(scope="module")
def checkpoints(hybrid_checkpoints):
    return hybrid_checkpoints


@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5_moe"])
def test_prompt_logits_match_transformers(checkpoints, family):
    model, path = checkpoints[family]
    source = CheckpointWeights(path)
    assert source.config.family == family
    if family == "qwen3_next":  # the fixture has a dense layer where we expect it
        assert source.config.dense_layers == (2,)
    ours = HybridReference.from_source(source)
    for prompt in PROMPTS:
        ids = torch.tensor(prompt)
        with torch.no_grad():
            ref = model(ids[None]).logits[0]
        torch.testing.assert_close(ours.logits(ids), ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5_moe"])
def test_greedy_tokens_match_transformers_generate(checkpoints, family):
    model, path = checkpoints[family]
    ours = HybridReference.from_source(CheckpointWeights(path))
    max_new = 8
    for prompt in PROMPTS[1:]:
        ids = list(prompt)
        for _ in range(max_new):  # the whole sequence again per token: fine at this size
            ids.append(int(ours.logits(torch.tensor(ids))[-1].argmax()))
        # transformers decodes with its cache: the recurrent form and carried conv state
        ref = model.generate(
            torch.tensor([prompt]), do_sample=False, max_new_tokens=max_new, attention_mask=None
        )[0].tolist()
        assert ids == ref


def test_multimodal_checkpoint_names_load_the_same_text_model(checkpoints, tmp_path):
    """Published Qwen3.5-MoE checkpoints prefix the text model with model.language_model."""
    _, path = checkpoints["qwen3_5_moe"]
    state = load_file(path / "model.safetensors")
    renamed = {k.replace("model.", "model.language_model.", 1): v for k, v in state.items()}
    renamed["model.visual.patch_embed.proj.weight"] = torch.zeros(2, 2)  # ignored
    save_file(renamed, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text((path / "config.json").read_text())
    prompt = torch.tensor(PROMPTS[1])
    a = HybridReference.from_source(CheckpointWeights(tmp_path)).logits(prompt)
    b = HybridReference.from_source(CheckpointWeights(path)).logits(prompt)
    assert torch.equal(a, b)


def test_gdn_layer_states_carried_across_chunks_equal_the_whole(checkpoints):
    """The layer returns the states a later prefill chunk or decode step starts from."""
    _, path = checkpoints["qwen3_5_moe"]
    ours = HybridReference.from_source(CheckpointWeights(path))
    w = CheckpointWeights(path).layer_weights(0, torch.device("cpu"), torch.float32).mixer
    x = torch.randn(70, 64, generator=torch.Generator().manual_seed(5))
    whole, ssm, conv = ours.gated_delta_net(w, x)
    first, ssm1, conv1 = ours.gated_delta_net(w, x[:45])
    second, ssm2, conv2 = ours.gated_delta_net(w, x[45:], ssm1, conv1)
    torch.testing.assert_close(torch.cat((first, second)), whole, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ssm2, ssm, atol=1e-5, rtol=1e-5)
    assert (
        torch.equal(conv2, conv) and ssm.shape == (4, 16, 8) and conv.shape == (96, 3)
    )  # 2·Hk·Dk + Hv·Dv
