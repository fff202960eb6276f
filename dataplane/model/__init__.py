"""rimuru.dataplane.model: the MoE decoder in plain PyTorch, its weights and its backends.

config.py       ModelConfig: the model's shapes and numerics, validated
hf_config.py    a Hugging Face config.json parsed into a ModelConfig
hybrid_config.py  the hybrid (Gated DeltaNet) families' layer types and GDN shapes
weights.py      typed weight pieces and the WeightSource protocol
loader.py       CheckpointWeights: a local HF directory of safetensors
presets.py      RandomWeights: public shapes, seeded random weights, router skew
backends.py     AttentionBackend / ExpertBackend, where the engine plugs in
transformer.py  MoETransformer: forward, compute_logits, router_logits
reference.py    dense reference backends (the oracle)

moe_block.py    routing, routed + shared experts or a dense MLP (every decoder's)

Hybrid models (Gated DeltaNet + gated attention + MoE):
hybrid_weights.py / hybrid_layout.py   their layer weights, read from either family's layout
gated_delta.py / causal_conv.py        the gated delta rule and short conv, with their states
hybrid_layers.py                       the layers' projections around the stateful steps
hybrid_transformer.py                  HybridTransformer: the engine's (states via a backend)
hybrid_reference.py                    HybridReference: the whole-sequence torch oracle
"""

from pathlib import Path

from rimuru.dataplane.model.backends import AttentionBackend, ExpertBackend
from rimuru.dataplane.model.config import ModelConfig
from rimuru.dataplane.model.hf_config import config_from_hf, load_config
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
    "model_config",
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
    _check_model_dir(model)
    try:
        return CheckpointWeights(model)
    except FileNotFoundError as exc:  # no safetensors, or a shard the index names is gone
        raise ValueError(str(exc)) from exc


def model_config(model: str) -> ModelConfig:
    """The config of `open_weights(model)` without reading any weights: for checks that
    should fail before an engine is built."""
    if model in PRESETS:
        return preset_config(model)
    _check_model_dir(model)
    return load_config(model)


def _check_model_dir(model: str) -> None:
    """A name that is not a preset must be a local model directory; say both when neither."""
    path = Path(model)
    if not path.is_dir():
        raise ValueError(
            f"model {model!r} is neither a preset ({', '.join(PRESETS)}) nor a local "
            f"directory: give a preset name or the path of a Hugging Face model directory "
            f"holding config.json and *.safetensors"
        )
    if not (path / "config.json").is_file():
        raise ValueError(
            f"{path} has no config.json: a model directory is a Hugging Face checkpoint "
            f"(config.json and *.safetensors); or give a preset ({', '.join(PRESETS)})"
        )
