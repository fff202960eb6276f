"""Where a model's weights come from: `open_weights` takes a preset name (seeded random
weights of a real model's shapes) or a local Hugging Face directory.

hf_config.py         config.json parsed into a ModelConfig
hf_layout.py, hybrid_layout.py   checkpoint tensors laid out as the decoders' weights
loader.py            CheckpointWeights: a local directory of safetensors
presets.py           RandomWeights: public shapes, seeded random weights, router skew
shard.py             a tensor-parallel rank's slice of the weights and its ModelConfig
"""

from pathlib import Path

from rimuru.dataplane.model.checkpoint.hf_config import config_from_hf, load_config
from rimuru.dataplane.model.checkpoint.loader import CheckpointWeights
from rimuru.dataplane.model.checkpoint.presets import PRESETS, RandomWeights, preset_config
from rimuru.dataplane.model.config import ModelConfig
from rimuru.dataplane.model.weights import WeightSource

__all__ = [
    "PRESETS",
    "CheckpointWeights",
    "RandomWeights",
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
