"""routing_histogram == its torch chain (the CPU path), under Triton's interpreter: the same
counts, padding rows left out, the running total updated in the same launch."""

import pytest
import torch

from rimuru.dataplane.engine.experts.routing_histogram import routing_histogram_torch as reference
from rimuru.kernels.routing_histogram import routing_histogram


@pytest.mark.parametrize(
    ("tokens", "experts", "top_k", "masked", "dtype"),
    [
        (5, 8, 2, False, torch.int64),  # Mixtral's shape of routing
        (160, 128, 8, True, torch.int64),  # Qwen3, 1,280 pairs: two chunks, padding rows
        (7, 60, 4, True, torch.int32),  # Qwen1.5: E not a power of two, int32 ids
    ],
)
def test_counts_and_total_match_the_torch_chain(tokens, experts, top_k, masked, dtype):
    gen = torch.Generator().manual_seed(tokens + experts)
    ids = torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(tokens)])
    ids = ids.to(dtype)
    mask = (torch.arange(tokens) % 3 != 2).long() if masked else None  # every third: padding
    start = torch.randint(0, 1000, (experts,), generator=gen)
    total, ref_total = start.clone(), start.clone()
    counts = routing_histogram(ids, experts, mask, total)
    ref = reference(ids, experts, mask, ref_total)
    assert counts.dtype == torch.int64
    assert torch.equal(counts, ref)
    assert torch.equal(total, ref_total)
    assert torch.equal(total - start, counts)
    kept = tokens - (tokens // 3 if masked else 0)
    assert int(counts.sum()) == kept * top_k


def test_hot_expert_and_no_total():
    # every pair on expert 3: one bin takes them all (the contention case of global atomics)
    ids = torch.full((300, 8), 3, dtype=torch.int64)
    counts = routing_histogram(ids, 16)
    assert counts.tolist() == [0, 0, 0, 2400] + [0] * 12


def test_out_of_range_ids_are_skipped_not_written():
    ids = torch.tensor([[0, 5], [-1, 1], [7, 1]])
    assert routing_histogram(ids, 4).tolist() == [1, 2, 0, 0]


def test_bad_shapes_are_refused():
    ids = torch.zeros(4, 2, dtype=torch.int64)
    with pytest.raises(ValueError, match="row_mask"):
        routing_histogram(ids, 8, row_mask=torch.ones(3, dtype=torch.int64))
    with pytest.raises(ValueError, match="int64"):
        routing_histogram(ids, 8, total=torch.zeros(8, dtype=torch.int32))


def test_a_layer_row_of_the_statistics_adds_up_over_steps():
    # the engine's case: total is row `layer` of an [L, E] tensor, updated step after step
    stats = torch.zeros(3, 60, dtype=torch.int64)
    gen = torch.Generator().manual_seed(7)
    steps = [torch.randint(0, 60, (9, 4), generator=gen) for _ in range(3)]
    for ids in steps:
        routing_histogram(ids, 60, None, stats[1])
    want = sum(reference(ids, 60) for ids in steps)
    assert torch.equal(stats[1], want)
    assert not stats[0].any() and not stats[2].any()


def test_a_strided_row_mask_is_read_by_row():
    ids = torch.tensor([[0], [1], [2]])
    mask = torch.tensor([1, 9, 0, 9, 1, 9])[::2]  # rows 0 and 2 count
    assert routing_histogram(ids, 4, mask).tolist() == [1, 0, 1, 0]
