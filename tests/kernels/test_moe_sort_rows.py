"""sort_rows writes x's row of every pair in the alignment's order."""

import pytest
import torch

from rimuru.kernels.moe_align import moe_align_block_size
from rimuru.kernels.moe_sort_rows import sort_rows, sort_rows_reference


@pytest.mark.parametrize(
    ("num_tokens", "top_k", "num_experts", "block_m"),
    [(1, 1, 4, 16), (37, 3, 5, 16), (200, 4, 9, 64)],
)
def test_sorted_rows_equal_the_reference(num_tokens, top_k, num_experts, block_m):
    gen = torch.Generator().manual_seed(num_tokens)
    x = torch.randn(num_tokens, 40, generator=gen)
    ids = torch.rand(num_tokens, num_experts, generator=gen).topk(top_k, dim=1).indices
    align = moe_align_block_size(ids.int(), num_experts, block_m)
    xs = sort_rows(x, align, top_k)
    used = align.sorted_pair_ids[: int(align.num_padded)]
    valid = used < align.num_pairs
    assert torch.equal(xs[: int(align.num_padded)][valid], sort_rows_reference(x, align, top_k))
    # Each pair's row sits where the alignment put the pair: x[p // K] at row r.
    r = int(valid.nonzero()[-1])
    assert torch.equal(xs[r], x[int(used[r]) // top_k])
