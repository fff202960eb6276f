"""The gated delta rule's two forms agree with each other and with transformers', and the
recurrent and conv states carried across a split give the whole sequence's result."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers.models.qwen3_next import modeling_qwen3_next as hf_next

from rimuru.dataplane.model.hybrid import gated_delta
from rimuru.dataplane.model.hybrid.causal_conv import causal_conv1d

T, HK, HV, DK, DV = 37, 2, 4, 8, 6


def _inputs(seed: int = 0, num_tokens: int = T):
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen)

    q = F.normalize(randn(num_tokens, HK, DK), dim=-1)
    k = F.normalize(randn(num_tokens, HK, DK), dim=-1)
    v = randn(num_tokens, HV, DV)
    g = -F.softplus(randn(num_tokens, HV))  # log decay <= 0
    beta = torch.sigmoid(randn(num_tokens, HV))
    state = randn(HV, DK, DV) * 0.5  # a non-zero carried state
    return q, k, v, g, beta, state


@pytest.mark.parametrize("chunk_size", [1, 8, 64])
def test_chunked_equals_recurrent(chunk_size):
    q, k, v, g, beta, state = _inputs()
    out_r, state_r = gated_delta.recurrent(q, k, v, g, beta, state)
    out_c, state_c = gated_delta.chunked(q, k, v, g, beta, state, chunk_size=chunk_size)
    torch.testing.assert_close(out_c, out_r, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(state_c, state_r, atol=1e-5, rtol=1e-5)
    assert state_r.dtype == torch.float32 and state_r.shape == (HV, DK, DV)


def test_recurrent_matches_transformers():
    q, k, v, g, beta, state = _inputs(seed=1)
    ours, our_state = gated_delta.recurrent(q, k, v, g, beta, state)
    ref, ref_state = hf_next.torch_recurrent_gated_delta_rule(
        q[None],
        k[None],
        v[None],
        g[None],
        beta[None],
        initial_state=state[None],
        output_final_state=True,
    )
    torch.testing.assert_close(ours, ref[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(our_state, ref_state[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("form", ["recurrent", "chunked"])
@pytest.mark.parametrize("split", [1, 13, 36])
def test_carrying_the_state_across_a_split_equals_the_whole(form, split):
    rule = getattr(gated_delta, form)
    kwargs = {"chunk_size": 8} if form == "chunked" else {}
    q, k, v, g, beta, _ = _inputs(seed=2)
    whole, whole_state = rule(q, k, v, g, beta, **kwargs)
    first, mid_state = rule(q[:split], k[:split], v[:split], g[:split], beta[:split], **kwargs)
    second, end_state = rule(
        q[split:], k[split:], v[split:], g[split:], beta[split:], mid_state, **kwargs
    )
    torch.testing.assert_close(torch.cat((first, second)), whole, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(end_state, whole_state, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("splits", [(), (1,), (2, 3), (5, 6, 7, 20)])
def test_conv_state_carried_across_splits_equals_the_whole(splits):
    gen = torch.Generator().manual_seed(3)
    x, weight = torch.randn(23, 10, generator=gen), torch.randn(10, 4, generator=gen)
    whole, whole_state = causal_conv1d(x, weight)
    # transformers' conv over the whole sequence (zero history), then SiLU
    ref = hf_next.causal_conv1d_fn(x.t()[None], weight, activation="silu")[0].t()
    torch.testing.assert_close(whole, ref, atol=1e-6, rtol=1e-6)
    assert torch.equal(whole_state, x[-3:].t())
    pieces, state, start = [], None, 0
    for end in (*splits, len(x)):
        out, state = causal_conv1d(x[start:end], weight, state)
        pieces.append(out)
        start = end
    torch.testing.assert_close(torch.cat(pieces), whole, atol=1e-6, rtol=1e-6)
    assert torch.equal(state, whole_state)


def test_bad_shapes_are_refused():
    q, k, v, g, beta, state = _inputs()
    with pytest.raises(ValueError, match="state must be fp32"):
        gated_delta.recurrent(q, k, v, g, beta, state.double())
    with pytest.raises(ValueError, match="multiple of Hk"):
        gated_delta.chunked(q, k, v[:, :3], g[:, :3], beta[:, :3])
    with pytest.raises(ValueError, match="state must be"):
        causal_conv1d(v[:, 0], torch.ones(DV, 4), torch.zeros(DV, 4))
