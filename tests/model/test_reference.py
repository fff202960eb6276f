"""The reference backends and the model's own contract (chunking, batching, bad input)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rimuru.dataplane.model import (
    ContiguousKVAttention,
    ContiguousKVMeta,
    DenseExperts,
    ExpertWeights,
    MoETransformer,
)
from rimuru.dataplane.model.checkpoint import RandomWeights


@pytest.fixture(scope="module")
def tiny():
    source = RandomWeights.preset("tiny", router_skew=1.0)
    experts = DenseExperts([source.expert_weights(i, torch.float32) for i in range(4)])
    return MoETransformer.from_source(source, ContiguousKVAttention(), experts)


def fresh(model: MoETransformer) -> MoETransformer:
    return model.with_backends(ContiguousKVAttention(), model.experts)


def test_dense_experts_equal_a_per_token_sum():
    g = torch.Generator().manual_seed(0)
    E, inter, D, T, K = 6, 8, 12, 10, 3
    w = ExpertWeights(
        w1=torch.randn(E, inter, D, generator=g),
        w3=torch.randn(E, inter, D, generator=g),
        w2=torch.randn(E, D, inter, generator=g),
    )
    x = torch.randn(T, D, generator=g)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    weights = torch.rand(T, K, generator=g)
    out = DenseExperts([w]).moe(0, x, ids, weights)
    for t in range(T):
        expected = sum(
            weights[t, k] * (w.w2[e] @ (F.silu(w.w1[e] @ x[t]) * (w.w3[e] @ x[t])))
            for k, e in enumerate(ids[t].tolist())
        )
        torch.testing.assert_close(out[t], expected, atol=1e-4, rtol=1e-5)


def test_expert_weights_reject_mismatched_shapes():
    with pytest.raises(ValueError, match=r"w2 = \[E, D, I\]"):
        ExpertWeights(w1=torch.zeros(2, 3, 4), w3=torch.zeros(2, 3, 4), w2=torch.zeros(2, 3, 4))


def test_chunked_prefill_and_decode_equal_one_full_prefill(tiny):
    tokens = torch.randint(0, 151936, (37,), generator=torch.Generator().manual_seed(3))
    full = fresh(tiny)
    expected = full.forward(tokens, torch.arange(37), ContiguousKVMeta.of([("s", 37)]))
    chunked = fresh(tiny)
    pieces = []
    for start, end in ((0, 16), (16, 35), (35, 36), (36, 37)):  # two prefill chunks, two decodes
        meta = ContiguousKVMeta.of([("s", end - start)])
        pieces.append(chunked.forward(tokens[start:end], torch.arange(start, end), meta))
    torch.testing.assert_close(torch.cat(pieces), expected, atol=1e-5, rtol=1e-5)


def test_batching_does_not_change_a_sequence(tiny):
    g = torch.Generator().manual_seed(4)
    a, b = torch.randint(0, 151936, (9,), generator=g), torch.randint(0, 151936, (5,), generator=g)
    alone = fresh(tiny).forward(a, torch.arange(9), ContiguousKVMeta.of([("a", 9)]))
    model = fresh(tiny)
    # b first, then a: a's rows are the last 9 and must not see b.
    both = model.forward(
        torch.cat([b, a]),
        torch.cat([torch.arange(5), torch.arange(9)]),
        ContiguousKVMeta.of([("b", 5), ("a", 9)]),
    )
    torch.testing.assert_close(both[5:], alone, atol=1e-5, rtol=1e-5)
    model.attention.free("b")
    assert (
        model.attention.num_cached_tokens("b") == 0
        and model.attention.num_cached_tokens("a", layer=3) == 9
    )


def test_router_logits_and_selection(tiny):
    x = torch.randn(5, 128, generator=torch.Generator().manual_seed(5))
    logits = tiny.router_logits(2, x)
    layer = tiny.layers[2]
    torch.testing.assert_close(logits, x @ layer.router.T + layer.router_bias)
    ids, weights = tiny.select_experts(logits)
    assert ids.shape == (5, 4) and ids.dtype == torch.int64 and weights.dtype == torch.float32
    torch.testing.assert_close(weights.sum(-1), torch.ones(5))  # Qwen3: renormalised top-k


def test_compute_logits_is_fp32_and_resident_bytes_count_tied_weights_once(tiny):
    logits = tiny.compute_logits(torch.zeros(2, 128))
    assert logits.shape == (2, 151936) and logits.dtype == torch.float32
    embed = 151936 * 128 * 4
    per_layer = 4 * (2 * 128 * 128 + 2 * 64 * 128 + 2 * 32 + 2 * 128 + 32 * 128 + 32)
    assert tiny.resident_nbytes() == embed + 128 * 4 + 4 * per_layer


def test_bad_input_is_refused(tiny):
    model = fresh(tiny)
    with pytest.raises(ValueError, match="1-D"):
        model.forward(
            torch.tensor([[1, 2]]), torch.tensor([[0, 1]]), ContiguousKVMeta.of([("s", 2)])
        )
    with pytest.raises(ValueError, match="meta covers 3 tokens but the step has 2"):
        model.forward(torch.tensor([1, 2]), torch.tensor([0, 1]), ContiguousKVMeta.of([("s", 3)]))
    with pytest.raises(ValueError, match="appears twice"):
        model.forward(
            torch.tensor([1, 2]), torch.tensor([0, 1]), ContiguousKVMeta.of([("s", 1), ("s", 1)])
        )
