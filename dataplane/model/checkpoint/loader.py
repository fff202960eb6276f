"""Load a local Hugging Face model directory: `config.json` plus `*.safetensors` shards.

Never touches the network. The weights are the file(s) transformers' `from_pretrained` reads
from the same directory, so the two never compute with different weights: config.json's
`transformers_weights` when set, else `model.safetensors`, else the shards that
`model.safetensors.index.json` names (a directory holding both a single file and an index is
read from the single file, as transformers does). A directory with neither, which transformers
refuses, is read from every `*.safetensors` file in it, unless two of them hold one tensor.
Tensors are read one at a time through `safetensors.safe_open` (memory-mapped), so a layer's
experts are stacked straight into their (pinned) host tensors without the whole checkpoint
ever being in RAM.

Routed experts are accepted in the two layouts found on disk:

    classic (real checkpoints, and what transformers' save_pretrained writes):
        {moe}.experts.{e}.gate_proj.weight / up_proj / down_proj      (Qwen families)
        block_sparse_moe.experts.{e}.w1.weight / w3 / w2              (Mixtral)
    fused (transformers 5's in-memory state dict):
        mlp.experts.gate_up_proj [E, 2I, D]   (gate rows first, then up)
        mlp.experts.down_proj    [E, D, I]

Hybrid models (Qwen3-Next, Qwen3.5-MoE) get `HybridLayerWeights` from `layer_weights`
(hybrid_layout.py). Qwen3.5-MoE's published checkpoints are the multimodal model: its text
model's tensors are `model.language_model.*` where transformers' text-only save writes
`model.*`; both are read (the vision tower's and MTP's tensors are ignored).

A block-FP8 checkpoint (config.json's quantization_config; block_fp8.py) keeps its routed
experts FP8 with their block scales (they fill the pool at one byte per element); every other
FP8 linear (attention, shared expert, dense MLP, GDN projections) is dequantized at load to
the model's dtype, and the tensors it leaves unquantized (embeddings, norms, router, LM head,
its modules_to_not_convert) are read as they are.

Every shard is opened (its header parsed) when the source is made, so a truncated or corrupt
file, a quantized one the model cannot compute with, or an FP8 weight without scales of its
block shape, is refused before any weight is read.
Errors about the checkpoint are `CheckpointError`s (a ValueError: the CLI reports them and
exits 2) naming the file or the tensor.

Shape key: E = experts, I = expert size, D = hidden.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from rimuru.dataplane.model.block_fp8 import BLOCK, FP8_DTYPE, dequantize, scale_shape
from rimuru.dataplane.model.checkpoint.hf_config import load_config, read_json
from rimuru.dataplane.model.checkpoint.hf_layout import (
    Fetch,
    build_global_weights,
    build_layer_weights,
)
from rimuru.dataplane.model.checkpoint.hybrid_layout import build_hybrid_layer_weights
from rimuru.dataplane.model.config import ModelConfig
from rimuru.dataplane.model.hybrid.weights import HybridLayerWeights
from rimuru.dataplane.model.weights import ExpertWeights, GlobalWeights, LayerWeights, host_empty

_SINGLE = "model.safetensors"
_INDEX = "model.safetensors.index.json"

# safetensors dtypes of unquantized weights; anything else (F8_E4M3, I8, U8, ...) is the
# storage of a quantization scheme.
_FLOAT_DTYPES = frozenset({"F32", "F16", "BF16", "F64"})
_SCALE_SUFFIX = ".weight_scale_inv"  # a block-FP8 weight's scales
# Tensors that exist only beside quantized weights (FP8 block scales, GPTQ/AWQ packs).
_QUANT_SUFFIXES = (
    "weight_scale_inv", "weight_scale", "input_scale", ".qweight", ".qzeros", ".scales", ".g_idx",
)  # fmt: skip


class CheckpointError(ValueError):
    """The checkpoint on disk is unusable: a file unreadable, a tensor missing or of another
    shape or dtype than config.json implies."""


class CheckpointWeights:
    """WeightSource over a local Hugging Face directory."""

    def __init__(self, model_dir: str | Path) -> None:
        self.model_dir = Path(model_dir)
        if not self.model_dir.is_dir():
            raise FileNotFoundError(f"model directory {self.model_dir} does not exist")
        self._config = load_config(self.model_dir)
        weights = _weights_file(self.model_dir)
        self._weights_name = weights.name if weights else "*.safetensors"
        self._files = _tensor_files(self.model_dir, weights)  # tensor name -> shard path
        # Opened once, all now: each open parses (and checks) the shard's header.
        self._handles = {path: _open(path) for path in sorted(set(self._files.values()))}
        self._refuse_quantized()
        # Mixtral's classic checkpoints call the MoE block block_sparse_moe; transformers 5 says mlp.
        self._moe = "mlp"
        self._text_prefix = "model."  # what "model." in a tensor name stands for on disk
        if "model.language_model.embed_tokens.weight" in self._files:
            self._text_prefix = "model.language_model."
        if self._config.family == "mixtral" and "model.layers.0.mlp.gate.weight" not in self._files:
            self._moe = "block_sparse_moe"

    @property
    def config(self) -> ModelConfig:
        return self._config

    def global_weights(self, device: torch.device, dtype: torch.dtype) -> GlobalWeights:
        return build_global_weights(self._config, self._fetcher(device, dtype))

    def layer_weights(
        self, layer: int, device: torch.device, dtype: torch.dtype
    ) -> LayerWeights | HybridLayerWeights:
        if self._config.is_hybrid:
            return build_hybrid_layer_weights(self._config, layer, self._fetcher(device, dtype))
        return build_layer_weights(self._config, layer, self._fetcher(device, dtype), self._moe)

    def expert_weights(
        self,
        moe_layer: int,
        dtype: torch.dtype,
        *,
        pin_memory: bool = False,
        work_device: torch.device | None = None,
    ) -> ExpertWeights:
        del work_device  # reading a file gains nothing from a device
        cfg = self._config
        cfg.check_moe_layer(moe_layer)
        layer = cfg.moe_layers[moe_layer]  # the checkpoint names decoder layers
        n, inter, hidden = cfg.num_experts, cfg.moe_intermediate_size, cfg.hidden_size
        fp8 = cfg.quant is not None
        dtype = cfg.expert_dtype if fp8 else dtype  # FP8 experts stay FP8 (block_fp8.py)
        w1 = host_empty((n, inter, hidden), dtype, pin_memory)
        w3 = host_empty((n, inter, hidden), dtype, pin_memory)
        w2 = host_empty((n, hidden, inter), dtype, pin_memory)
        fused = f"model.layers.{layer}.mlp.experts."
        if self._disk_name(fused + "gate_up_proj") in self._files:
            if fp8:
                raise CheckpointError(
                    f"{self.model_dir}: FP8 experts in the fused layout ({fused}gate_up_proj) "
                    f"are not supported; save the checkpoint with one tensor per expert"
                )
            gate_up = self._read(fused + "gate_up_proj", (n, 2 * inter, hidden))
            w1.copy_(gate_up[:, :inter])
            w3.copy_(gate_up[:, inter:])
            w2.copy_(self._read(fused + "down_proj", (n, hidden, inter)))
            return ExpertWeights(w1=w1, w3=w3, w2=w2)
        names = ("w1", "w3", "w2") if self._moe == "block_sparse_moe" else _QWEN_EXPERT_NAMES
        if not fp8:
            for e in range(n):
                p = f"model.layers.{layer}.{self._moe}.experts.{e}."
                w1[e].copy_(self._read(p + names[0] + ".weight", (inter, hidden)))
                w3[e].copy_(self._read(p + names[1] + ".weight", (inter, hidden)))
                w2[e].copy_(self._read(p + names[2] + ".weight", (hidden, inter)))
            return ExpertWeights(w1=w1, w3=w3, w2=w2)
        scales = [
            torch.empty((n, *scale_shape(*m.shape[1:])), dtype=torch.float32) for m in (w1, w3, w2)
        ]
        for e in range(n):
            p = f"model.layers.{layer}.{self._moe}.experts.{e}."
            for name, matrix, scale in zip(names, (w1, w3, w2), scales, strict=True):
                q, s = self._read_fp8(p + name + ".weight", tuple(matrix.shape[1:]))
                matrix[e].copy_(q)
                scale[e].copy_(s)
        return ExpertWeights(w1, w3, w2, *scales)

    def _fetcher(self, device: torch.device, dtype: torch.dtype) -> Fetch:
        return lambda name, shape: self._read(name, shape).to(device=device, dtype=dtype)

    def _refuse_quantized(self) -> None:
        """Every tensor is plain float, or (in a block-FP8 checkpoint) an e4m3 weight with
        its fp32 `weight_scale_inv` of the block shape beside it; anything else is the
        storage of another scheme, or a malformed FP8 checkpoint, named here."""
        fp8 = self._config.quant is not None
        for name, path in self._files.items():
            try:
                tensor = self._handles[path].get_slice(name)
            except SafetensorError as exc:
                raise CheckpointError(
                    f"{self._weights_name} maps {name!r} to {path}, which lacks it: the index "
                    f"and the shards disagree; fetch the checkpoint again"
                ) from exc
            dtype = tensor.get_dtype()
            if fp8 and name.endswith(_SCALE_SUFFIX):
                weight = name.removesuffix("_scale_inv")
                weight_path = self._files.get(weight)
                stored = weight_path and self._handles[weight_path].get_slice(weight).get_dtype()
                if stored != "F8_E4M3":
                    raise CheckpointError(
                        f"{name!r} in {path} scales no FP8 weight: {weight!r} is "
                        f"{stored or 'missing'}; the checkpoint is malformed"
                    )
                continue  # its shape is checked with its weight
            if fp8 and dtype == "F8_E4M3":
                self._check_fp8_tensor(name, tuple(tensor.get_shape()))
                continue
            if fp8 and dtype.startswith("F8"):
                raise CheckpointError(
                    f"tensor {name!r} in {path} is {dtype}, but config.json declares fmt 'e4m3' "
                    f"(F8_E4M3): the checkpoint and its config disagree"
                )
            if dtype not in _FLOAT_DTYPES or name.endswith(_QUANT_SUFFIXES):
                raise CheckpointError(
                    f"tensor {name!r} in {path} is {dtype}: a quantized checkpoint, which rimuru "
                    f"cannot compute with (it loads unquantized float32/bfloat16/float16 "
                    f"weights, and block-wise FP8 declared in config.json's "
                    f"quantization_config); use the model's unquantized (e.g. BF16) release"
                )

    def _check_fp8_tensor(self, name: str, shape: tuple[int, ...]) -> None:
        scale_name = name + "_scale_inv"
        path = self._files.get(scale_name)
        if not name.endswith(".weight") or len(shape) != 2 or path is None:
            raise CheckpointError(
                f"FP8 tensor {name!r} has no {scale_name!r} beside it: block-wise FP8 weights "
                f"need their fp32 block scales; the checkpoint is incomplete"
            )
        scale = self._handles[path].get_slice(scale_name)
        expected = scale_shape(*shape)
        # fp32 mostly; some Qwen3 -FP8 releases store bf16 or fp16 scales (read as fp32)
        if scale.get_dtype() not in _FLOAT_DTYPES or tuple(scale.get_shape()) != expected:
            raise CheckpointError(
                f"{scale_name!r} in {path.name} is {scale.get_dtype()} "
                f"{tuple(scale.get_shape())}, but {name!r} {shape} needs float scales {expected} "
                f"(one scale per {BLOCK} x {BLOCK} block)"
            )

    def _disk_name(self, name: str) -> str:
        if name.startswith("model."):
            return self._text_prefix + name.removeprefix("model.")
        return name

    def _read(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        """A float tensor; a block-FP8 weight comes dequantized to fp32 (the caller casts)."""
        tensor = self._read_stored(name, shape)
        if tensor.dtype != FP8_DTYPE:
            return tensor
        return dequantize(tensor, self._read_stored(name + "_scale_inv", None), torch.float32)

    def _read_fp8(self, name: str, shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """A block-FP8 weight: (e4m3 [N, K] as stored, its scales in fp32)."""
        tensor = self._read_stored(name, shape)
        if tensor.dtype != FP8_DTYPE:
            raise CheckpointError(
                f"tensor {self._disk_name(name)!r} is {tensor.dtype}, but the experts of a "
                f"block-FP8 checkpoint must be FP8 (e4m3) with their block scales"
            )
        return tensor, self._read_stored(name + "_scale_inv", None).to(torch.float32)

    def _read_stored(self, name: str, shape: tuple[int, ...] | None) -> torch.Tensor:
        name = self._disk_name(name)
        path = self._files.get(name)
        if path is None:
            raise CheckpointError(
                f"tensor {name!r} is missing from the checkpoint in {self.model_dir}; "
                f"is config.json's architecture ({self._config.family}) the right one?"
            )
        try:
            tensor = self._handles[path].get_tensor(name)
        except SafetensorError as exc:
            raise CheckpointError(f"cannot read tensor {name!r} from {path}: {exc}") from None
        if shape is not None and tuple(tensor.shape) != shape:
            raise CheckpointError(
                f"tensor {name!r} in {path.name} has shape {tuple(tensor.shape)}, but config.json "
                f"implies {shape}"
            )
        return tensor


_QWEN_EXPERT_NAMES = ("gate_proj", "up_proj", "down_proj")
_INDEX_SUFFIX = ".safetensors.index.json"


def _weights_file(model_dir: Path) -> Path | None:
    """The file transformers' `from_pretrained` reads from a local directory (a single
    safetensors file or a shard index), checked in its order; None when it would find none.
    What must stay true: this order is transformers' (modeling_utils'
    `_get_resolved_checkpoint_files`), or the two read different weights from one folder."""
    explicit = read_json(model_dir / "config.json").get("transformers_weights")
    if explicit is not None:
        if not isinstance(explicit, str) or not explicit.endswith((".safetensors", _INDEX_SUFFIX)):
            raise CheckpointError(
                f"config.json's transformers_weights must name a *.safetensors file or a "
                f"*{_INDEX_SUFFIX} index in {model_dir}, got {explicit!r}"
            )
        path = (model_dir / explicit).resolve()
        if not path.is_relative_to(model_dir.resolve()):
            raise CheckpointError(
                f"config.json's transformers_weights must name a file inside {model_dir}, "
                f"got {explicit!r}"
            )
        if not path.is_file():
            raise FileNotFoundError(
                f"config.json's transformers_weights names {explicit!r}, which is not in "
                f"{model_dir}"
            )
        return path
    for name in (_SINGLE, _INDEX):
        if (model_dir / name).is_file():
            return model_dir / name
    return None


def _tensor_files(model_dir: Path, weights: Path | None) -> dict[str, Path]:
    """Map every tensor name to its file: the index's shards, the single file, or (with
    neither) every *.safetensors file in the directory."""
    if weights is not None and weights.name.endswith(_INDEX_SUFFIX):
        weight_map = read_json(weights).get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{weights} has no weight_map object: is the index complete?")
        # Shard names are relative to the model directory (not the index's folder), as
        # transformers resolves them.
        shards = {model_dir / f for f in set(weight_map.values())}
        missing = sorted(p.name for p in shards if not p.is_file())
        if missing:
            raise FileNotFoundError(
                f"{weights.name} in {model_dir} names missing shard(s): {missing}"
            )
        return {name: model_dir / f for name, f in weight_map.items()}
    shards = [weights] if weights is not None else sorted(model_dir.glob("*.safetensors"))
    if not shards:
        raise FileNotFoundError(
            f"no *.safetensors files in {model_dir}; rimuru reads safetensors checkpoints only"
        )
    files: dict[str, Path] = {}
    for path in shards:
        for name in _names_in(path):
            if name in files:  # no index to say which: reading either could be wrong
                raise CheckpointError(
                    f"tensor {name!r} is in both {files[name].name} and {path.name} in "
                    f"{model_dir}, which has no {_SINGLE} or {_INDEX} to say which to read: "
                    f"remove the file that is not the model's, or add its index"
                )
            files[name] = path
    return files


def _names_in(path: Path) -> Iterable[str]:
    with _open(path) as f:
        return list(f.keys())


def _open(path: Path) -> safe_open:
    """A shard's handle; a file safetensors cannot parse (truncated, not safetensors at all)
    is named with what to do about it."""
    try:
        return safe_open(path, framework="pt")
    except SafetensorError as exc:
        raise CheckpointError(
            f"{path} is not a readable safetensors file ({exc}): it may be truncated or "
            f"corrupt, e.g. an interrupted download; fetch it again"
        ) from None
