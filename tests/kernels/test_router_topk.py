"""router_topk == the model's torch path (layers.router_topk: float, bias, softmax, topk,
renorm), under Triton's interpreter: the same experts in the same order, the same weights."""

import pytest
import torch

from rimuru.dataplane.model.layers import router_topk as router_topk_reference
from rimuru.kernels.router_topk import router_topk


@pytest.mark.parametrize(
    ("dtype", "tokens", "experts", "top_k", "bias", "renormalize"),
    [
        (torch.float32, 5, 8, 2, False, False),  # Mixtral's shape of routing
        (torch.bfloat16, 33, 128, 8, True, True),  # Qwen3 with the presets' skew; 3 programs
        (torch.float16, 7, 60, 4, False, False),  # Qwen1.5: E not a power of two, no renorm
        (torch.float32, 3, 6, 3, True, True),  # K not a power of two
        (torch.float32, 2, 4, 4, False, True),  # K = E
    ],
)
def test_router_topk_matches_the_torch_chain(dtype, tokens, experts, top_k, bias, renormalize):
    gen = torch.Generator().manual_seed(tokens * 100 + experts)
    # distinct logits, exact in every dtype (torch's order among equal ones is unspecified)
    ranks = torch.stack([torch.randperm(experts, generator=gen) for _ in range(tokens)])
    logits = ((ranks - experts / 2) / 8).to(dtype)
    skew = -torch.log1p(torch.randperm(experts, generator=gen).float()) if bias else None
    ids, weights = router_topk(logits, skew, top_k, renormalize)
    ref_ids, ref_weights = router_topk_reference(logits, skew, top_k, renormalize)
    assert ids.dtype == torch.int64 and weights.dtype == torch.float32
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(weights, ref_weights, rtol=1e-6, atol=1e-7)
    if renormalize:
        torch.testing.assert_close(weights.sum(-1), torch.ones(tokens))


@pytest.mark.filterwarnings("ignore:All-NaN slice", "ignore:invalid value")  # NaN rows
def test_ties_go_to_the_lower_expert_and_every_row_gets_distinct_experts():
    inf, nan = float("inf"), float("nan")
    logits = torch.tensor(
        [[1.0, 3.0, 3.0, 0.0], [0.0, -inf, 1.0, -inf], [-inf] * 4, [nan] * 4, [nan, 2.0, 1.0, 0.0]]
    )
    ids, weights = router_topk(logits, None, 3, True)
    assert ids.tolist() == [[1, 2, 0], [2, 0, 1], [0, 1, 2], [0, 1, 2], [1, 2, 3]]
    e = torch.exp(torch.tensor([0.0, -1.0, -2.0]))
    torch.testing.assert_close(weights[0], e[[0, 0, 2]] / e[[0, 0, 2]].sum())
    torch.testing.assert_close(weights[1], torch.tensor([e[0], e[1], 0.0]) / (e[0] + e[1]))
    torch.testing.assert_close(weights[4], e / e.sum())  # routed over the numbers


def test_a_strided_logits_view_and_no_tokens():
    wide = torch.randn(4, 16, generator=torch.Generator().manual_seed(3))
    view = wide[:, :8]  # row stride 16: the router's output sliced
    ids, weights = router_topk(view, None, 2, False)
    ref_ids, ref_weights = router_topk_reference(view, None, 2, False)
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(weights, ref_weights, rtol=1e-6, atol=1e-7)
    ids, weights = router_topk(torch.empty(0, 8), None, 2, True)
    assert ids.shape == (0, 2) and weights.shape == (0, 2)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"logits": torch.zeros(3, 4, dtype=torch.int32)}, "float"),
        ({"top_k": 5}, "top_k"),
        ({"bias": torch.zeros(3)}, "bias"),
        ({"bias": torch.zeros(4, dtype=torch.float16)}, "bias"),
    ],
)
def test_bad_arguments_are_refused(kwargs, message):
    args = {"logits": torch.zeros(3, 4), "bias": None, "top_k": 2, "renormalize": True} | kwargs
    with pytest.raises(ValueError, match=message):
        router_topk(**args)
