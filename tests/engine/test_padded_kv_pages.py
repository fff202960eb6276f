"""A model whose KV page does not divide its expert page, served end to end with padded KV
slots (refused before padding): the same greedy tokens as transformers, under resident and
under elastic with a pool tight enough that experts are evicted for KV."""

from __future__ import annotations

import pytest
import torch
import transformers

from rimuru.dataplane.engine.sched.request import SamplingParams
from rimuru.dataplane.memory.geometry import PagePadding, PageType

PROMPTS = [[(5 * i + 11 * j) % 256 for j in range(18 + 13 * i)] for i in range(5)]
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def padded_checkpoint(tmp_path_factory):
    # fp32 expert page = 40 x 64 x 4 = 10240 B = 5 * 2^11; KV page = 2 x 16 x 2 x 16 x 4 =
    # 4096 B does not divide it: padded to 5120 B, two per expert page
    torch.manual_seed(5)
    model = transformers.Qwen2MoeForCausalLM(
        transformers.Qwen2MoeConfig(
            vocab_size=256,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            initializer_range=0.15,
            moe_intermediate_size=40,
            shared_expert_intermediate_size=64,
            num_experts=8,
            num_experts_per_tok=2,
            eos_token_id=None,
        )
    ).eval()
    path = tmp_path_factory.mktemp("qwen2_moe_padded_kv")
    model.save_pretrained(path)
    return model, path


@pytest.mark.parametrize(("mode", "extra_kv_blocks"), [("resident", None), ("elastic", 4)])
def test_padded_kv_pages_give_transformers_greedy_tokens(
    padded_checkpoint, make_checkpoint_engine, mode, extra_kv_blocks
):
    model, path = padded_checkpoint
    engine = make_checkpoint_engine(path, mode, extra_kv_blocks)
    g = engine.geometry
    assert g.padding[1] == PagePadding(PageType.KV, 4096, 5120)
    assert g.expert_page_bytes == 10240 and g.kv_pages_per_expert_page == 2
    assert engine.pool.view(PageType.KV).stride(0) == 5120 // 4
    got = engine.generate(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
    engine.check_invariants()
    assert engine.num_leaked_pages() == 0
    if mode == "elastic":
        assert engine.expert_counters.evictions > 0  # KV was short: experts made room
    for prompt, tokens in zip(PROMPTS, got, strict=True):
        with torch.no_grad():
            ref = model.generate(
                torch.tensor([prompt]), do_sample=False, max_new_tokens=MAX_TOKENS
            )[0, len(prompt) :].tolist()
        assert tokens == ref
