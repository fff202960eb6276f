"""exponential_race: one token per row, greedy or drawn from softmax(logits / T), in one launch.

    exponential_race(logits [B, V], inv_temperature [B] fp32, keys [B] int64) -> [B] int64

A row with inverse temperature 0 takes its argmax. Any other row takes
argmax(logits * inv_temperature - log E) with E = -log U, U ~ U(0, 1) from Philox keyed by the
row's `keys` value and counted by vocabulary index: the Gumbel-max trick, which picks token i
with probability softmax(logits / T)[i] without a sort, a normalisation or noise in memory.
One program per row walks the vocabulary in blocks, keeping each lane's best score and its
first index; ties go to the lowest index, as torch.argmax's do.

The draw is a pure function of (key, vocabulary index): the caller makes a request's key from
its seed and its draw count, so a seeded request draws the same tokens in any batch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# the smallest normal fp32: -log U stays finite and > 0 (a constexpr: jit code reads it)
_TINY = tl.constexpr(1.1754943508222875e-38)
_BLOCK = 1024


# The vocabulary size is fixed by the model, the row stride by the batch's logits: one
# variant. The per-row vectors are small host uploads of any alignment.
@triton.jit(do_not_specialize_on_alignment=["inv_temperature_ptr", "keys_ptr"])
def _race_kernel(
    logits_ptr,
    inv_temperature_ptr,
    keys_ptr,
    out_ptr,
    stride_row,
    vocab,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    inv_t = tl.load(inv_temperature_ptr + row)
    key = tl.load(keys_ptr + row)
    base = logits_ptr + row.to(tl.int64) * stride_row
    lanes = tl.arange(0, BLOCK)
    best = tl.full((BLOCK,), float("-inf"), tl.float32)
    best_index = tl.zeros((BLOCK,), tl.int32)
    for start in range(0, vocab, BLOCK):
        cols = start + lanes
        inside = cols < vocab
        score = tl.load(base + cols, mask=inside, other=float("-inf")).to(tl.float32)
        if inv_t > 0:
            u = tl.maximum(tl.rand(key, cols), _TINY)
            score = score * inv_t - tl.log(-tl.log(u))
        score = tl.where(inside, score, float("-inf"))
        better = score > best  # strict: a later block never takes a tie from an earlier one
        best_index = tl.where(better, cols, best_index)
        best = tl.where(better, score, best)
    top = tl.max(best, axis=0)
    first = tl.min(tl.where(best == top, best_index, vocab), axis=0)
    tl.store(out_ptr + row, first.to(tl.int64))


def exponential_race(
    logits: torch.Tensor, inv_temperature: torch.Tensor, keys: torch.Tensor
) -> torch.Tensor:
    """logits [B, V] (fp32/bf16/fp16, unit stride along V), inv_temperature [B] fp32 (0 =
    greedy), keys [B] int64 -> [B] int64 token ids, on the logits' device, without waiting."""
    if logits.dim() != 2 or logits.stride(1) != 1:
        raise ValueError(
            f"logits must be [B, V] with unit stride along V, got {tuple(logits.shape)}"
        )
    rows, vocab = logits.shape
    if inv_temperature.shape != (rows,) or keys.shape != (rows,):
        raise ValueError(f"inv_temperature and keys must be [{rows}]")
    out = torch.empty(rows, dtype=torch.int64, device=logits.device)
    if rows:
        _race_kernel[(rows,)](
            logits, inv_temperature.float(), keys.long(), out, logits.stride(0), vocab,
            BLOCK=_BLOCK,
        )  # fmt: skip
    return out
