"""Tiny random transformers models of each family, saved with save_pretrained, built once."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import transformers


@dataclass(frozen=True)
class HFCheckpoint:
    name: str  # the family, or the family + "_mixed" (dense layers between MoE layers)
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
    qwen2 = dict(
        common,
        intermediate_size=128,  # the dense layers' MLP
        moe_intermediate_size=32,
        shared_expert_intermediate_size=96,
        num_experts=8,
        num_experts_per_tok=4,  # top-4 of 8, NOT renormalised
        norm_topk_prob=False,
        eos_token_id=None,
    )
    qwen3 = dict(
        common,
        head_dim=32,  # != hidden / heads, as in Qwen3-30B-A3B
        intermediate_size=96,  # the dense layers' MLP
        moe_intermediate_size=32,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        eos_token_id=None,
    )
    # Dense layers between MoE layers, as transformers lays them out: Qwen2's are 0 and 2
    # (every 2nd layer is MoE, and layer 0 is listed too), Qwen3's is 1 (listed).
    qwen2_mixed = dict(qwen2, num_hidden_layers=4, decoder_sparse_step=2, mlp_only_layers=[0])
    qwen3_mixed = dict(qwen3, num_hidden_layers=4, mlp_only_layers=[1])
    torch.manual_seed(1234)
    return {
        "qwen2_moe": transformers.Qwen2MoeForCausalLM(transformers.Qwen2MoeConfig(**qwen2)),
        "qwen3_moe": transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(**qwen3)),
        "mixtral": transformers.MixtralForCausalLM(
            transformers.MixtralConfig(
                **common, intermediate_size=32, num_local_experts=8, num_experts_per_tok=2
            )
        ),
        "qwen2_moe_mixed": transformers.Qwen2MoeForCausalLM(
            transformers.Qwen2MoeConfig(**qwen2_mixed)
        ),
        "qwen3_moe_mixed": transformers.Qwen3MoeForCausalLM(
            transformers.Qwen3MoeConfig(**qwen3_mixed)
        ),
    }


@pytest.fixture(scope="session")
def hf_checkpoints(tmp_path_factory) -> dict[str, HFCheckpoint]:
    root = tmp_path_factory.mktemp("hf")
    out = {}
    for name, model in _hf_models().items():
        model.eval()
        model.save_pretrained(root / name)
        out[name] = HFCheckpoint(name, model, root / name)
    return out
