"""Block-FP8 checkpoints written by the tests: a saved float model quantized as Qwen's -FP8
releases are (every decoder linear to e4m3 with `weight_scale_inv` per 128 x 128 block;
embeddings, norms, routers, the shared-expert gate, convs and lm_head left as they are),
beside its plain twin holding the dequantized weights in fp32.

The quantizer here is the test's own (not block_fp8.quantize), so a bug in ours cannot hide
in both the checkpoint and the reader."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

FP8_CONFIG = {
    "quant_method": "fp8",
    "fmt": "e4m3",
    "activation_scheme": "dynamic",
    "weight_block_size": [128, 128],
}
_QUANTIZED = re.compile(r"\.layers\.\d+\..*(proj(_\w+)?|\.w[123])\.weight$")
_E4M3_MAX = 448.0


def quantize_blocks(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] float -> (e4m3 [N, K], fp32 [ceil(N/128), ceil(K/128)]), block by block."""
    rows, cols = weight.shape
    scales = torch.empty(-(-rows // 128), -(-cols // 128), dtype=torch.float32)
    q = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    for i in range(scales.shape[0]):
        for j in range(scales.shape[1]):
            block = weight[i * 128 : (i + 1) * 128, j * 128 : (j + 1) * 128].float()
            scale = block.abs().max() / _E4M3_MAX
            scale = scale if scale > 0 else torch.tensor(1.0)
            scales[i, j] = scale
            q[i * 128 : (i + 1) * 128, j * 128 : (j + 1) * 128] = (block / scale).to(q.dtype)
    return q, scales


def dequantize_blocks(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    out = q.float()
    for i in range(scales.shape[0]):
        for j in range(scales.shape[1]):
            out[i * 128 : (i + 1) * 128, j * 128 : (j + 1) * 128] *= scales[i, j]
    return out


def is_quantized(name: str) -> bool:
    return bool(_QUANTIZED.search(name)) and "shared_expert_gate" not in name


def write_fp8_twins(src: Path, root: Path) -> tuple[Path, Path]:
    """`src` (config.json + model.safetensors) -> (root/fp8, root/plain)."""
    fp8, plain = root / "fp8", root / "plain"
    for d in (fp8, plain):
        d.mkdir(parents=True)
        for extra in ("generation_config.json",):
            if (src / extra).is_file():
                shutil.copy(src / extra, d / extra)
    stored, dequantized = {}, {}
    for name, tensor in load_file(src / "model.safetensors").items():
        if is_quantized(name) and tensor.dim() == 2:
            q, scales = quantize_blocks(tensor)
            stored[name], stored[name + "_scale_inv"] = q, scales
            dequantized[name] = dequantize_blocks(q, scales)
        else:
            stored[name] = dequantized[name] = tensor
    assert any(t.dtype == torch.float8_e4m3fn for t in stored.values())
    save_file(stored, fp8 / "model.safetensors")
    save_file(dequantized, plain / "model.safetensors")
    config = json.loads((src / "config.json").read_text())
    config.pop("quantization_config", None)
    (plain / "config.json").write_text(json.dumps(config))
    (fp8 / "config.json").write_text(json.dumps({**config, "quantization_config": FP8_CONFIG}))
    return fp8, plain
