"""Presets: public shapes, seeded lazy weights, and the router skew law."""

from __future__ import annotations

import pytest
import torch

from rimuru.dataplane.model import (
    ContiguousKVAttention,
    ContiguousKVMeta,
    DenseExperts,
    MoETransformer,
)
from rimuru.dataplane.model.checkpoint import PRESETS, RandomWeights, preset_config
from rimuru.dataplane.model.checkpoint.presets import zipf_router_bias

# name: (layers, D, experts, I, top-k, heads, kv heads, head dim, shared size, vocab)
PUBLIC_SHAPES = {
    "qwen1.5-moe-a2.7b": (24, 2048, 60, 1408, 4, 16, 16, 128, 5632, 151936),
    "qwen3-30b-a3b": (48, 2048, 128, 768, 8, 32, 4, 128, 0, 151936),
    "mixtral-8x7b": (32, 4096, 8, 14336, 2, 32, 8, 128, 0, 32000),
}


@pytest.mark.parametrize("name", sorted(PUBLIC_SHAPES))
def test_presets_have_the_public_shapes(name):
    c = preset_config(name)
    shape = (c.num_layers, c.hidden_size, c.num_experts, c.moe_intermediate_size, c.top_k)
    shape += (c.num_heads, c.num_kv_heads, c.head_dim, c.shared_expert_intermediate_size)
    assert (*shape, c.vocab_size) == PUBLIC_SHAPES[name]
    assert c.dtype == torch.bfloat16


def test_tiny_is_a_cpu_model_that_accepts_qwen_token_ids():
    c = PRESETS["tiny"]
    assert c.dtype == torch.float32 and c.vocab_size == 151936
    assert c.num_experts >= 16 and c.top_k == 4 and c.num_layers == 4


def test_unknown_preset_lists_the_names():
    with pytest.raises(ValueError, match="mixtral-8x7b"):
        preset_config("gpt-5")


def test_a_big_preset_generates_one_layer_alone():
    # Layer 47 of the 30B model, produced without any other layer existing.
    layer = RandomWeights.preset("qwen3-30b-a3b").layer_weights(
        47, torch.device("cpu"), torch.bfloat16
    )
    assert layer.attention.q_proj.shape == (4096, 2048) and layer.attention.k_proj.shape == (
        512,
        2048,
    )
    assert layer.attention.q_proj.dtype == torch.bfloat16 and layer.router.shape == (128, 2048)
    assert layer.attention.q_norm.shape == (128,) and layer.shared_expert is None


def test_weights_are_deterministic_by_seed_and_independent_of_order():
    cpu = torch.device("cpu")
    a, b, other = (
        RandomWeights.preset("tiny"),
        RandomWeights.preset("tiny"),
        RandomWeights.preset("tiny", seed=1),
    )
    for i in range(3):  # generate other layers first on one source only
        a.layer_weights(i, cpu, torch.float32)
    la, lb = a.layer_weights(3, cpu, torch.float32), b.layer_weights(3, cpu, torch.float32)
    assert torch.equal(la.attention.q_proj, lb.attention.q_proj) and torch.equal(
        la.router, lb.router
    )
    assert not torch.equal(la.router, other.layer_weights(3, cpu, torch.float32).router)
    ea, eb = a.expert_weights(2, torch.float32), b.expert_weights(2, torch.float32)
    assert torch.equal(ea.w2, eb.w2) and not torch.equal(ea.w1, ea.w3)
    assert ea.w1.shape == (32, 128, 128) and ea.w2.shape == (32, 128, 128)
    assert torch.equal(
        a.global_weights(cpu, torch.float32).embed_tokens,
        b.global_weights(cpu, torch.float32).lm_head,
    )


def test_layer_out_of_range_is_refused():
    source = RandomWeights.preset("tiny")
    with pytest.raises(ValueError, match="MoE layer 4 is out of range: the model has 4 MoE layers"):
        source.expert_weights(4, torch.float32)
    with pytest.raises(ValueError, match="layer -1 is out of range"):
        source.layer_weights(-1, torch.device("cpu"), torch.float32)


def test_pinning_needs_cuda():
    if torch.cuda.is_available():
        assert (
            RandomWeights.preset("tiny")
            .expert_weights(0, torch.float32, pin_memory=True)
            .w1.is_pinned()
        )
    else:
        with pytest.raises(ValueError, match="needs CUDA"):
            RandomWeights.preset("tiny").expert_weights(0, torch.float32, pin_memory=True)


def test_skew_bias_is_zipf_law_over_a_per_layer_permutation():
    s, E = 1.3, 32
    bias = zipf_router_bias(E, s, seed=0, layer=0)
    ranks = torch.argsort(torch.argsort(-bias))  # 0 = largest bias
    expected = (1.0 + ranks.double()) ** -s
    torch.testing.assert_close(torch.softmax(bias.double(), 0), expected / expected.sum())
    hottest = {int(zipf_router_bias(E, s, seed=0, layer=i).argmax()) for i in range(4)}
    assert len(hottest) > 1  # the hot experts differ by layer
    with pytest.raises(ValueError, match="router_skew"):
        RandomWeights.preset("tiny", router_skew=-1.0)


class RecordingExperts:
    """Real DenseExperts that also counts how often each expert is routed to, per layer."""

    def __init__(self, inner: DenseExperts, num_layers: int, num_experts: int) -> None:
        self.inner = inner
        self.counts = torch.zeros(num_layers, num_experts, dtype=torch.int64)

    def moe(self, layer, x, topk_ids, topk_weights):
        self.counts[layer] += torch.bincount(topk_ids.flatten(), minlength=self.counts.shape[1])
        return self.inner.moe(layer, x, topk_ids, topk_weights)


def routing_histogram(router_skew: float) -> tuple[torch.Tensor, RandomWeights]:
    source = RandomWeights.preset("tiny", router_skew=router_skew)
    cfg = source.config
    experts = RecordingExperts(
        DenseExperts([source.expert_weights(i, torch.float32) for i in range(cfg.num_layers)]),
        cfg.num_layers,
        cfg.num_experts,
    )
    model = MoETransformer.from_source(source, ContiguousKVAttention(), experts)
    g = torch.Generator().manual_seed(7)
    # Many short sequences: tokens of one sequence share their attention context, so their
    # routing is correlated; 64 sequences average that out.
    ids = torch.randint(0, cfg.vocab_size, (64 * 8,), generator=g)
    positions = torch.arange(8).repeat(64)
    model.forward(ids, positions, ContiguousKVMeta.of([(i, 8) for i in range(64)]))
    return experts.counts.double() / experts.counts.sum(1, keepdim=True), source


def test_skew_makes_routing_follow_the_bias_and_zero_skew_is_near_uniform():
    uniform, _ = routing_histogram(0.0)  # [L, E] share of routing slots per expert
    skewed, source = routing_histogram(1.0)
    top4_share = lambda h: h.sort(dim=1, descending=True).values[:, :4].sum(1)  # noqa: E731
    # 4 of 32 experts hold 12.5% of the slots when uniform (about 16% with sampling noise);
    # measured: skew 0 -> 0.18-0.22, skew 1 -> 0.57-0.61.
    assert top4_share(uniform).max() < 0.25, top4_share(uniform)
    assert top4_share(skewed).min() > 0.45, top4_share(skewed)
    for layer in range(source.config.num_layers):
        bias = zipf_router_bias(32, 1.0, seed=0, layer=layer)
        # The most-used expert is one the bias ranks among the three hottest.
        assert int(skewed[layer].argmax()) in bias.topk(3).indices.tolist()
