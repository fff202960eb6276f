"""rimuru.dataplane.model: the MoE decoder in plain PyTorch, its weights and its backends.

config.py       ModelConfig, parsed from a Hugging Face config.json
weights.py      typed weight pieces and the WeightSource protocol
loader.py       CheckpointWeights: a local HF directory of safetensors
presets.py      RandomWeights: public shapes, seeded random weights, router skew
backends.py     AttentionBackend / ExpertBackend, where the engine plugs in
transformer.py  MoETransformer: forward, compute_logits, router_logits
reference.py    dense reference backends (the oracle)
"""

from rimuru.dataplane.model.backends import AttentionBackend, ExpertBackend
from rimuru.dataplane.model.config import ModelConfig, config_from_hf, load_config
from rimuru.dataplane.model.loader import CheckpointWeights
from rimuru.dataplane.model.presets import PRESETS, RandomWeights, preset_config
from rimuru.dataplane.model.reference import ContiguousKVAttention, ContiguousKVMeta, DenseExperts
from rimuru.dataplane.model.transformer import MoETransformer
from rimuru.dataplane.model.weights import ExpertWeights, LayerWeights, WeightSource

__all__ = [
    "PRESETS",
    "AttentionBackend",
    "CheckpointWeights",
    "ContiguousKVAttention",
    "ContiguousKVMeta",
    "DenseExperts",
    "ExpertBackend",
    "ExpertWeights",
    "LayerWeights",
    "MoETransformer",
    "ModelConfig",
    "RandomWeights",
    "WeightSource",
    "config_from_hf",
    "load_config",
    "open_weights",
    "preset_config",
]


def open_weights(model: str, *, seed: int = 0, router_skew: float = 0.0) -> WeightSource:
    """A preset name (random weights) or the path of a local Hugging Face directory."""
    if model in PRESETS:
        return RandomWeights.preset(model, seed=seed, router_skew=router_skew)
    if router_skew:
        raise ValueError(
            "router_skew applies to presets only, not to a checkpoint's trained router"
        )
    return CheckpointWeights(model)
