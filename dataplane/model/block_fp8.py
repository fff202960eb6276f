"""Block-wise FP8 weights (the format of Qwen's and DeepSeek's -FP8 releases): e4m3 values
with one fp32 scale per 128 x 128 block.

    weight            float8_e4m3fn [N, K]                      (N = out, K = in)
    weight_scale_inv  float32 [ceil(N / 128), ceil(K / 128)]
    dequantized       weight[n, k] * weight_scale_inv[n // 128, k // 128]

The name says "inverse" because quantizing divides by it: each block's scale is its largest
magnitude over e4m3's largest finite value (448), so the block's values fill e4m3's range.
The last block of a row or column may be partial (N or K not a multiple of 128); its scale
covers what there is.

What must stay true: `dequantize` is the one definition of the format's math the engine
computes with (the torch MoE path, the non-expert weights dequantized at load, the tests'
plain-checkpoint twin), so an FP8 model and its dequantized copy give the same tokens.
"""

from __future__ import annotations

import torch

BLOCK = 128  # the only block size served: weight_block_size [128, 128]
FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8_DTYPE).max  # 448.0


def num_blocks(size: int) -> int:
    return -(-size // BLOCK)


def scale_shape(rows: int, cols: int) -> tuple[int, int]:
    """The shape of a [rows, cols] weight's block scales."""
    return num_blocks(rows), num_blocks(cols)


def _expand(scale: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """[..., ceil(rows/128), ceil(cols/128)] -> [..., rows, cols], each scale over its block."""
    return scale.repeat_interleave(BLOCK, dim=-2).repeat_interleave(BLOCK, dim=-1)[
        ..., :rows, :cols
    ]


def dequantize(weight: torch.Tensor, scale_inv: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """FP8 `weight` [..., N, K] and its fp32 block scales -> `dtype`, computed in fp32 (an
    e4m3 value times an fp32 scale is exact in fp32; the one rounding is to `dtype`)."""
    rows, cols = weight.shape[-2:]
    full = _expand(scale_inv.to(device=weight.device, dtype=torch.float32), rows, cols)
    return (weight.to(torch.float32) * full).to(dtype)


def quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A float weight [..., N, K] -> (float8_e4m3fn [..., N, K], fp32 scales): each block
    scaled so its largest magnitude is 448 (an all-zero block gets scale 1)."""
    rows, cols = weight.shape[-2:]
    w = weight.to(torch.float32)
    pad_r, pad_c = num_blocks(rows) * BLOCK - rows, num_blocks(cols) * BLOCK - cols
    padded = torch.nn.functional.pad(w, (0, pad_c, 0, pad_r))
    blocks = padded.unflatten(-1, (-1, BLOCK)).unflatten(-3, (-1, BLOCK))  # [.., nr, B, nc, B]
    amax = blocks.abs().amax(dim=(-3, -1))  # [..., nr, nc]
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = (w / _expand(scale, rows, cols)).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, scale
