"""rimuru.dataplane.model: the MoE decoder in plain PyTorch, its weights and its backends.

config.py            ModelConfig: the model's shapes and numerics, validated
linear_attention.py  the hybrid (Gated DeltaNet) families' layer types and GDN shapes
weights.py           typed weight pieces and the WeightSource protocol
backends.py          AttentionBackend / ExpertBackend / StateBackend, where the engine plugs in
transformer.py       MoETransformer: forward, compute_logits, router_logits
reference.py         dense reference backends (the oracle)
moe_block.py         routing, routed + shared experts or a dense MLP (every decoder's)
layers.py, ops.py    norms, RoPE, attention projections; the ops the engine swaps for kernels
tokenizer.py         Qwen vocabularies, the streaming detokenizer
hybrid/              Gated DeltaNet + gated attention + MoE (Qwen3-Next, Qwen3.5-MoE)
checkpoint/          where weights come from: a local Hugging Face directory or a preset
"""

from rimuru.dataplane.model.backends import AttentionBackend, ExpertBackend
from rimuru.dataplane.model.config import ModelConfig
from rimuru.dataplane.model.reference import ContiguousKVAttention, ContiguousKVMeta, DenseExperts
from rimuru.dataplane.model.transformer import MoETransformer
from rimuru.dataplane.model.weights import ExpertWeights, LayerWeights, WeightSource

__all__ = [
    "AttentionBackend",
    "ContiguousKVAttention",
    "ContiguousKVMeta",
    "DenseExperts",
    "ExpertBackend",
    "ExpertWeights",
    "LayerWeights",
    "MoETransformer",
    "ModelConfig",
    "WeightSource",
]
