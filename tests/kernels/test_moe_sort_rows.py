"""sort_rows writes x's row of every pair in the alignment's order."""

import pytest
import torch

from rimuru.kernels.moe_align import moe_align_block_size
from rimuru.kernels.moe_gemm import _grid_size
from rimuru.kernels.moe_sort_rows import sort_rows, sort_rows_reference


@pytest.mark.parametrize(
    ("num_tokens", "top_k", "num_experts", "block_m", "hidden"),
    [(1, 1, 4, 16, 40), (37, 3, 5, 16, 40), (200, 4, 9, 64, 40), (23, 2, 3, 32, 1100)],
)
def test_sorted_rows_equal_the_reference(num_tokens, top_k, num_experts, block_m, hidden):
    """hidden 1100: three column chunks of 512, the last one partial."""
    gen = torch.Generator().manual_seed(num_tokens)
    x = torch.randn(num_tokens, hidden, generator=gen)
    ids = torch.rand(num_tokens, num_experts, generator=gen).topk(top_k, dim=1).indices
    align = moe_align_block_size(ids.int(), num_experts, block_m)
    xs = sort_rows(x, align, top_k)
    num_padded = int(align.num_padded)
    assert torch.equal(xs[:num_padded], sort_rows_reference(x, align, top_k))
    # Each pair's row sits where the alignment put the pair; padding rows are zeros.
    used = align.sorted_pair_ids[:num_padded]
    r = int((used < align.num_pairs).nonzero()[-1])
    assert torch.equal(xs[r], x[int(used[r]) // top_k])
    padding = (used >= align.num_pairs).nonzero()[:, 0]
    assert padding.numel() > 0 and not xs[padding].any()


def test_a_persistent_launch_takes_at_most_one_program_per_sm():
    cpu = torch.device("cpu")  # the interpreter stands for 3 SMs
    assert _grid_size(10, "grid", cpu) == 10
    assert _grid_size(10, "persistent", cpu) == 3
    assert _grid_size(10, "flattened", cpu) == 3
    assert _grid_size(2, "persistent", cpu) == 2
