"""RandomWeights builds the hybrid (Gated DeltaNet) models: every layer of `tiny-hybrid` with
its layer type's mixer, seeded like the other presets, initialised as transformers' Qwen3-Next /
Qwen3.5-MoE are so that a random model's activations stay sane, router skew included."""

from __future__ import annotations

import dataclasses

import torch

from rimuru.dataplane.model.checkpoint import PRESETS
from rimuru.dataplane.model.checkpoint.presets import RandomWeights, zipf_router_bias
from rimuru.dataplane.model.hybrid.reference import HybridReference
from rimuru.dataplane.model.hybrid.weights import (
    GatedAttentionWeights,
    GatedDeltaNetWeights,
    HybridLayerWeights,
)

CPU, F32 = torch.device("cpu"), torch.float32
TINY_HYBRID = PRESETS["tiny-hybrid"]


def _shapes(weights) -> dict[str, tuple[int, ...]]:
    return {f.name: tuple(getattr(weights, f.name).shape) for f in dataclasses.fields(weights)}


def _prompt(num_tokens: int, vocab_size: int) -> torch.Tensor:
    return torch.randint(0, vocab_size, (num_tokens,), generator=torch.Generator().manual_seed(3))


def test_tiny_hybrid_is_qwen35_shrunk_with_tinys_vocabulary():
    cfg, tiny = TINY_HYBRID, PRESETS["tiny"]
    assert (cfg.family, cfg.dtype, cfg.num_layers, cfg.hidden_size) == (
        "qwen3_5_moe", F32, 4, 128,
    )  # fmt: skip
    assert cfg.layer_types == ("linear_attention",) * 3 + ("full_attention",)
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rotary_dim) == (4, 2, 64, 16)
    assert (cfg.num_experts, cfg.top_k, cfg.moe_intermediate_size) == (16, 4, 128)
    assert cfg.shared_expert_intermediate_size == 128 and cfg.moe_layers == (0, 1, 2, 3)
    assert (cfg.vocab_size, cfg.bos_token_id, cfg.eos_token_ids) == (
        tiny.vocab_size, tiny.bos_token_id, tiny.eos_token_ids,
    )  # fmt: skip
    gdn = cfg.linear_attention
    assert gdn.conv_dim == 2 * 2 * 32 + 4 * 32 == 256
    assert gdn.ssm_state_shape == (4, 32, 32) and gdn.conv_state_shape == (256, 3)


def test_every_layer_has_the_mixer_of_its_layer_type_at_its_shapes():
    source = RandomWeights.preset("tiny-hybrid")
    for layer, layer_type in enumerate(TINY_HYBRID.layer_types):
        w = source.layer_weights(layer, CPU, F32)
        assert isinstance(w, HybridLayerWeights)
        if layer_type == "linear_attention":
            assert isinstance(w.mixer, GatedDeltaNetWeights)
            assert _shapes(w.mixer) == {
                "qkv_proj": (256, 128),
                "z_proj": (128, 128),
                "b_proj": (4, 128),
                "a_proj": (4, 128),
                "conv_weight": (256, 4),
                "dt_bias": (4,),
                "a_log": (4,),
                "norm": (32,),
                "out_proj": (128, 128),
            }
        else:
            assert isinstance(w.mixer, GatedAttentionWeights)
            assert _shapes(w.mixer) == {
                "q_proj": (256, 128),
                "gate_proj": (256, 128),
                "k_proj": (128, 128),
                "v_proj": (128, 128),
                "o_proj": (128, 256),
                "q_norm": (64,),
                "k_norm": (64,),
            }
        assert w.router.shape == (16, 128) and w.router_bias is None and w.dense_mlp is None
        assert _shapes(w.shared_expert) == {
            "gate_proj": (128, 128),
            "up_proj": (128, 128),
            "down_proj": (128, 128),
            "gate": (1, 128),
        }
    experts = source.expert_weights(3, F32)
    assert experts.w1.shape == experts.w3.shape == experts.w2.shape == (16, 128, 128)
    g = source.global_weights(CPU, F32)
    assert g.embed_tokens.shape == (151936, 128) and g.lm_head is g.embed_tokens


def test_inits_follow_transformers_hybrid_init():
    source = RandomWeights.preset("tiny-hybrid")
    gdn, attn = (source.layer_weights(i, CPU, F32) for i in (0, 3))
    # Norms that scale by (1 + w) start at w = 0; the GDN's gated norm scales by w: 1.
    zero_centred = [gdn.input_norm, gdn.post_attention_norm, attn.mixer.q_norm, attn.mixer.k_norm]
    zero_centred.append(source.global_weights(CPU, F32).norm)
    assert all(torch.equal(w, torch.zeros_like(w)) for w in zero_centred)
    assert torch.equal(gdn.mixer.norm, torch.ones(32))
    assert torch.equal(gdn.mixer.dt_bias, torch.ones(4))
    decay_rate = gdn.mixer.a_log.exp()  # A ~ U(0.01, 16)
    assert ((decay_rate > 0.01) & (decay_rate < 16)).all() and decay_rate.unique().numel() == 4
    for tensor, std in [
        (gdn.mixer.qkv_proj, 0.02),
        (attn.mixer.o_proj, 0.02),
        (gdn.mixer.conv_weight, 4**-0.5),  # unit gain over the conv's 4 taps
        (gdn.router, 128**-0.5),  # router logits of a normalised input ~ N(0, 1)
    ]:
        assert abs(tensor.std().item() / std - 1) < 0.1, (tuple(tensor.shape), tensor.std())


def test_same_seed_same_tensors_in_any_order_other_seed_other_tensors():
    a, b = RandomWeights.preset("tiny-hybrid"), RandomWeights.preset("tiny-hybrid")
    other = RandomWeights.preset("tiny-hybrid", seed=1)
    for layer in (0, 1, 3):  # generated on `a` only, before layer 2
        a.layer_weights(layer, CPU, F32)
    la, lb, lo = (s.layer_weights(2, CPU, F32) for s in (a, b, other))
    for name in ("qkv_proj", "z_proj", "conv_weight", "a_log", "out_proj"):
        assert torch.equal(getattr(la.mixer, name), getattr(lb.mixer, name)), name
        assert not torch.equal(getattr(la.mixer, name), getattr(lo.mixer, name)), name
    assert torch.equal(la.router, lb.router) and not torch.equal(la.router, lo.router)
    ea, eb, eo = (s.expert_weights(2, F32) for s in (a, b, other))
    assert torch.equal(ea.w1, eb.w1) and not torch.equal(ea.w1, eo.w1)


def test_reference_forward_of_tiny_hybrid_gives_finite_logits():
    ref = HybridReference.from_source(RandomWeights.preset("tiny-hybrid"))
    logits = ref.logits(_prompt(40, TINY_HYBRID.vocab_size))
    assert logits.shape == (40, 151936) and logits.isfinite().all()
    assert (logits.std(dim=-1) > 0).all()


def test_router_skew_biases_moe_layers_only_by_decoder_layer():
    # Qwen3-Next's layout with a dense layer: decoder layer 1 has no router, so MoE layer m
    # is decoder layer (0, 2, 3)[m]; the bias is keyed by decoder layer, as in the non-hybrid
    # families, and the experts are seeded by their decoder layer's tensor names.
    cfg = TINY_HYBRID.replace(family="qwen3_next", dense_layers=(1,), dense_intermediate_size=96)
    skewed, again = RandomWeights(cfg, router_skew=1.5), RandomWeights(cfg, router_skew=1.5)
    plain = RandomWeights(cfg)
    for layer in range(cfg.num_layers):
        s, a, p = (source.layer_weights(layer, CPU, F32) for source in (skewed, again, plain))
        if layer not in cfg.moe_layers:
            assert s.router is None and s.router_bias is None and s.dense_mlp is not None
            continue
        assert torch.equal(s.router, p.router) and p.router_bias is None  # weights untouched
        expected = zipf_router_bias(cfg.num_experts, 1.5, seed=0, layer=layer)
        assert torch.equal(s.router_bias, expected) and torch.equal(a.router_bias, expected)
    ids = _prompt(16, cfg.vocab_size)
    skewed_logits = HybridReference.from_source(skewed).logits(ids)
    assert torch.equal(skewed_logits, HybridReference.from_source(again).logits(ids))
    assert not torch.allclose(skewed_logits, HybridReference.from_source(plain).logits(ids))


def test_qwen35_shapes_keep_the_hidden_state_rms_sane_in_bf16():
    """One full layer cycle (3 GDN, 1 attention) at Qwen3.5-35B-A3B's shapes. Cut to stay fast
    on a CPU: 8 experts, all routed (a near-uniform router's renormalised top-8 weights are
    ~1/8 each, as with 256 experts, so the routed output keeps its scale), 4096 vocabulary
    rows (iid, so one token's embedding is as before). Measured over all 40 layers (seed 0):
    0.58 after the first, growing smoothly to 3.3 after the last; Qwen3-Next's 48: 3.6."""
    base = PRESETS["qwen3.5-35b-a3b"]
    cfg = base.replace(
        num_layers=4, layer_types=base.layer_types[:4], num_experts=8, vocab_size=4096
    )
    ref = HybridReference.from_source(RandomWeights(cfg), torch.bfloat16)
    h = ref.hidden_states(_prompt(40, cfg.vocab_size))
    assert h.dtype == torch.bfloat16
    rms = h.float().pow(2).mean(dim=-1).sqrt()  # [T]
    assert ((rms > 0.1) & (rms < 100)).all(), rms  # the embedding alone is 0.02
