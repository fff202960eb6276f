"""Tail tiles at their thresholds, under Triton's interpreter (kernels/moe_gemm.py).

An expert's last block computes BM/4, BM/2 or BM rows, by how many pairs it holds. The
routing here gives the experts pair counts on both sides of each threshold, so a threshold
off by one row drops a pair (a wrong output) and a tail that is never taken leaves no
NaN-poisoned rows of the up GEMM's output unwritten.
"""

import pytest
import torch

from rimuru.kernels import GemmTile, MoeConfig, fused_moe_contiguous, fused_moe_reference
from rimuru.kernels.moe_align import moe_align_block_size
from rimuru.kernels.moe_gemm import WeightSource, launch_up_gemm

BM = 64
# Pairs per expert: BM/4 and one more, BM/2 and one more, BM - 1, BM, BM + 1, 2BM + BM/2 + 1.
COUNTS = [16, 17, 32, 33, 63, 64, 65, 161]
HIDDEN, INTER = 32, 24


def _routing(gen: torch.Generator) -> torch.Tensor:
    ids = torch.cat([torch.full((n,), e) for e, n in enumerate(COUNTS)])
    return ids[torch.randperm(ids.numel(), generator=gen)].view(-1, 1)  # top-1: a pair a token


def _rows_computed(pairs_in_block: int, tail: int) -> int:
    rows = BM
    for halving in range(1, tail + 1):
        if pairs_in_block <= BM >> halving:
            rows = BM >> halving
    return rows


@pytest.mark.parametrize("tail", [0, 1, 2])
def test_each_block_computes_the_rows_its_tail_allows(tail):
    gen = torch.Generator().manual_seed(tail)
    ids = _routing(gen)
    E = len(COUNTS)
    x = torch.randn(ids.shape[0], HIDDEN, generator=gen)
    w13 = torch.randn(E, 2 * INTER, HIDDEN, generator=gen) / HIDDEN**0.5
    align = moe_align_block_size(ids, E, BM)
    act = torch.full((align.max_blocks * BM, INTER), float("nan"))
    weights = torch.ones(ids.numel())
    source = WeightSource(w13, w13, False, 0, w13.stride(0))
    launch_up_gemm(x, act, source, align, weights, GemmTile(32, 16, tail=tail),
                   inter_size=INTER, top_k=1)  # fmt: skip

    used = int(align.num_padded.item()) // BM
    pairs = (align.sorted_pair_ids[: used * BM].view(used, BM) < ids.numel()).sum(1).tolist()
    written = act[: used * BM].view(used, BM, INTER).isfinite().all(2).sum(1).tolist()
    assert written == [_rows_computed(n, tail) for n in pairs]
    assert sorted(n for n in pairs if n < BM) == sorted(n % BM for n in COUNTS if n % BM)


@pytest.mark.parametrize("tail", [1, 2])
@pytest.mark.parametrize("tma", [False, True])
def test_pairs_on_both_sides_of_a_threshold_are_all_computed(tail, tma):
    gen = torch.Generator().manual_seed(10 + tail)
    ids = _routing(gen)
    E = len(COUNTS)
    x = torch.randn(ids.shape[0], HIDDEN, generator=gen)
    w1 = torch.randn(E, INTER, HIDDEN, generator=gen) / HIDDEN**0.5
    w3 = torch.randn(E, INTER, HIDDEN, generator=gen) / HIDDEN**0.5
    w2 = torch.randn(E, HIDDEN, INTER, generator=gen) / INTER**0.5
    weights = torch.rand(ids.shape, generator=gen)
    config = MoeConfig(BM, GemmTile(32, 16, tail=tail), GemmTile(32, 16, tma=tma, tail=tail))
    out = torch.full_like(x, float("nan"))
    w13 = torch.cat([w1, w3], dim=1)
    fused_moe_contiguous(x, ids, weights, w13, w2, config=config, out=out)
    ref = fused_moe_reference(x, ids, weights, w1, w3, w2)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
