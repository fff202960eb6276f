"""count_routes adds each pair's weight into its expert's counter, in place, like the torch
chain it replaces (under Triton's interpreter)."""

import pytest
import torch

from rimuru.kernels.route_counts import count_routes, count_routes_reference


@pytest.mark.parametrize("with_rows", [False, True])
@pytest.mark.parametrize(("tokens", "top_k", "experts"), [(1, 1, 4), (300, 8, 128), (7, 4, 60)])
def test_counts_match_the_torch_chain(tokens, top_k, experts, with_rows):
    gen = torch.Generator().manual_seed(tokens + top_k)
    ids = torch.rand(tokens, experts, generator=gen).topk(top_k, dim=1).indices
    rows = (torch.arange(tokens) % 3 != 2).to(torch.int64) if with_rows else None  # padding 0
    start = torch.randint(0, 50, (experts,), generator=gen)  # counts accumulate
    stats = torch.randint(0, 50, (experts,), generator=gen)
    also, also_want = stats.clone(), stats.clone()
    got = count_routes(ids.to(torch.int32), rows, start.clone(), also)
    want = count_routes_reference(ids, rows, start.clone(), also_want)
    assert torch.equal(got, want)
    assert torch.equal(also, also_want)
    assert torch.equal(also - stats, got - start)
    assert int(got.sum() - start.sum()) == top_k * (tokens if rows is None else int(rows.sum()))


def test_bad_arguments_are_refused():
    ids = torch.zeros(3, 2, dtype=torch.int64)
    with pytest.raises(ValueError, match="counts must be"):
        count_routes(ids, None, torch.zeros(4, dtype=torch.int32))
    with pytest.raises(ValueError, match="also must be"):
        count_routes(
            ids, None, torch.zeros(4, dtype=torch.int64), torch.zeros(5, dtype=torch.int64)
        )
    with pytest.raises(ValueError, match="also must be contiguous"):
        count_routes(
            ids, None, torch.zeros(4, dtype=torch.int64), torch.zeros(4, 2, dtype=torch.int64)[:, 0]
        )
    with pytest.raises(ValueError, match="rows must be"):
        count_routes(ids, torch.ones(2, dtype=torch.int64), torch.zeros(4, dtype=torch.int64))
    with pytest.raises(ValueError, match="topk_ids must be"):
        count_routes(ids.float(), None, torch.zeros(4, dtype=torch.int64))
