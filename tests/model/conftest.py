"""Tiny random transformers models of each family, saved with save_pretrained, built once."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import transformers


@dataclass(frozen=True)
class HFCheckpoint:
    family: str
    model: transformers.PreTrainedModel  # fp32, eval mode
    path: Path  # save_pretrained output (classic per-expert tensor names)


def _hf_models() -> dict[str, transformers.PreTrainedModel]:
    common = dict(
        vocab_size=512,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.15,  # larger than the default so layers, not the embedding, dominate
    )
    torch.manual_seed(1234)
    qwen2 = transformers.Qwen2MoeForCausalLM(
        transformers.Qwen2MoeConfig(
            **common,
            intermediate_size=128,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=96,
            num_experts=8,
            num_experts_per_tok=4,  # top-4 of 8, NOT renormalised
            norm_topk_prob=False,
            eos_token_id=None,
        )
    )
    qwen3 = transformers.Qwen3MoeForCausalLM(
        transformers.Qwen3MoeConfig(
            **common,
            head_dim=32,  # != hidden / heads, as in Qwen3-30B-A3B
            moe_intermediate_size=32,
            num_experts=8,
            num_experts_per_tok=2,
            norm_topk_prob=True,
            tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 1e6},
            eos_token_id=None,
        )
    )
    mixtral = transformers.MixtralForCausalLM(
        transformers.MixtralConfig(
            **common, intermediate_size=32, num_local_experts=8, num_experts_per_tok=2
        )
    )
    return {"qwen2_moe": qwen2, "qwen3_moe": qwen3, "mixtral": mixtral}


@pytest.fixture(scope="session")
def hf_checkpoints(tmp_path_factory) -> dict[str, HFCheckpoint]:
    root = tmp_path_factory.mktemp("hf")
    out = {}
    for family, model in _hf_models().items():
        model.eval()
        model.save_pretrained(root / family)
        out[family] = HFCheckpoint(family, model, root / family)
    return out
