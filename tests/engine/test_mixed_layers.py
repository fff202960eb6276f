"""A model with dense layers between MoE layers, served end to end: the dense MLPs are resident
weights, only the MoE layers' experts are in the pool, the ranking and the residency table, and
the elastic policy's evictions change no token (the same greedy tokens as transformers)."""

from __future__ import annotations

import pytest
import torch
import transformers

from rimuru.dataplane.engine.sched.request import SamplingParams
from rimuru.dataplane.engine.startup.capacity import non_pool_weight_bytes
from rimuru.dataplane.memory.geometry import PageType
from rimuru.policy import EXPERT_MATRICES

PROMPTS = [[(7 * i + 3 * j) % 512 for j in range(20 + 9 * i)] for i in range(6)]
MAX_TOKENS = 10
DENSE, MOE = (0, 2), (1, 3)  # decoder_sparse_step=2 makes 0 and 2 dense; 0 is listed too


@pytest.fixture(scope="module")
def mixed_checkpoint(tmp_path_factory):
    torch.manual_seed(99)
    model = transformers.Qwen2MoeForCausalLM(
        transformers.Qwen2MoeConfig(
            vocab_size=512,
            hidden_size=64,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            initializer_range=0.15,
            intermediate_size=128,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=96,
            num_experts=8,
            num_experts_per_tok=2,
            decoder_sparse_step=2,
            mlp_only_layers=[0],
            eos_token_id=None,
        )
    ).eval()
    path = tmp_path_factory.mktemp("qwen2_moe_mixed")
    model.save_pretrained(path)
    return model, path


def test_only_moe_layers_have_experts_and_dense_mlps_are_resident(
    mixed_checkpoint, make_checkpoint_engine
):
    model, path = mixed_checkpoint
    engine = make_checkpoint_engine(path, "resident", None)
    mc = engine.model_config
    assert (mc.dense_layers, mc.moe_layers) == (DENSE, MOE)
    assert len(engine.host_experts) == len(engine.residency.resident) == 2
    assert (engine.ranking.num_layers, engine.ranking.num_experts) == (2, 8)
    assert engine.residency.num_resident() == 2 * 8
    owned = engine.allocator.num_owned(PageType.EXPERT)
    assert owned == 2 * 8 * EXPERT_MATRICES
    assert engine.model.layers[0].router is None and engine.model.layers[1].dense_mlp is None
    # Resident bytes = every transformers parameter but the routed experts (fp32): the dense
    # MLPs count there, like attention; the capacity plan counts the same without weights.
    resident = sum(
        p.numel() * 4 for name, p in model.named_parameters() if ".mlp.experts." not in name
    )
    assert engine.model.resident_nbytes() == resident
    assert non_pool_weight_bytes(mc, torch.float32, router_skew=0.0) == resident


@pytest.mark.parametrize("expert_copy", ["device", "host"])
def test_elastic_engine_evicts_and_gives_transformers_greedy_tokens(
    mixed_checkpoint, make_checkpoint_engine, expert_copy
):
    """host copies also predict the next MoE layer's experts across the dense layer between."""
    model, path = mixed_checkpoint
    engine = make_checkpoint_engine(path, "elastic", 4, expert_copy=expert_copy)
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    got = engine.generate(PROMPTS, params)
    engine.check_invariants()
    assert engine.num_leaked_pages() == 0
    assert engine.expert_counters.evictions > 0  # KV was short: the adjuster made room
    assert min(s.num_experts_resident for s in engine.stats) < 2 * 8
    if expert_copy == "host":
        assert engine.expert_counters.predictor_needed > 0
    for prompt, tokens in zip(PROMPTS, got, strict=True):
        with torch.no_grad():
            ref = model.generate(
                torch.tensor([prompt]), do_sample=False, max_new_tokens=MAX_TOKENS
            )[0, len(prompt) :].tolist()
        assert tokens == ref
