"""rms_norm and qk_norm_rope (interpreter) == their torch references == the model's layers.

Every product and sum is rounded in torch's order, so fp16 RoPE agrees to the last bit; a
norm may differ by one fp16 ulp where the fp32 sum of squares adds in another order. (bf16 is
not compared here: the interpreter's fp32 -> bf16 cast truncates instead of rounding.)"""

import pytest
import torch

from rimuru.dataplane.model.layers import apply_rope, rope_cos_sin, rope_inv_freq
from rimuru.dataplane.model.layers import rms_norm as model_rms_norm
from rimuru.kernels.rms_norm import rms_norm, rms_norm_reference
from rimuru.kernels.rope import qk_norm_rope, qk_norm_rope_reference


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-6)
    else:  # one fp16 ulp at most, from the fp32 reduction's order
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("n", [128, 96, 40])  # a power of two, and rows shorter than a block
def test_rms_norm_matches_the_model_layer(dtype, n):
    g = torch.Generator().manual_seed(n)
    x = (3 * torch.randn(7, n, generator=g)).to(dtype)
    w = (1 + 0.1 * torch.randn(n, generator=g)).to(dtype)
    got = rms_norm(x, w, 1e-6)
    assert got.shape == x.shape and got.dtype == dtype
    _close(got, rms_norm_reference(x, w, 1e-6), dtype)
    assert torch.equal(rms_norm_reference(x, w, 1e-6), model_rms_norm(x, w, 1e-6))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_fused_add_rms_norm_returns_the_rounded_sum_as_the_new_residual(dtype):
    g = torch.Generator().manual_seed(1)
    x, r = torch.randn(2, 5, 64, generator=g).to(dtype)
    w = torch.randn(64, generator=g).to(dtype)
    y, residual = rms_norm(x, w, 1e-5, residual=r)
    want_y, _ = rms_norm_reference(x, w, 1e-5, residual=r)
    assert torch.equal(residual, x + r)  # the sum, rounded to the dtype, exactly
    _close(y, want_y, dtype)
    assert torch.equal(want_y, model_rms_norm(x + r, w, 1e-5))


def test_rms_norm_reads_strided_rows_and_refuses_bad_shapes():
    g = torch.Generator().manual_seed(2)
    wide = torch.randn(6, 80, generator=g)
    x = wide[:, :32]  # rows 80 apart
    w = torch.ones(32)
    _close(rms_norm(x, w, 1e-6), rms_norm_reference(x, w, 1e-6), torch.float32)
    with pytest.raises(ValueError, match=r"weight must be \[32\]"):
        rms_norm(x, torch.ones(31), 1e-6)
    with pytest.raises(ValueError, match="residual must match x"):
        rms_norm(x, w, 1e-6, residual=torch.zeros(6, 31))
    with pytest.raises(ValueError, match=r"contiguous torch\.float32 vector"):
        rms_norm(x, torch.ones(64)[::2], 1e-6)
    assert rms_norm(torch.empty(0, 32), w, 1e-6).shape == (0, 32)


def _qk(dtype, tokens=5, hq=4, hkv=2, dh=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(tokens, hq, dh, generator=g).to(dtype)
    k = torch.randn(tokens, hkv, dh, generator=g).to(dtype)
    positions = torch.tensor([0, 1, 7, 300, 4095, 12, 2, 9][:tokens])
    cos, sin = rope_cos_sin(positions, rope_inv_freq(dh, 1e6, torch.device("cpu")), dtype)
    return q, k, cos, sin


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_rope_alone_matches_the_model_rotation(dtype):
    q, k, cos, sin = _qk(dtype)
    got_q, got_k = qk_norm_rope(q, k, cos, sin)
    want_q, want_k = qk_norm_rope_reference(q, k, cos, sin)
    assert torch.equal(want_q, apply_rope(q, cos, sin)) and torch.equal(
        want_k, apply_rope(k, cos, sin)
    )
    if dtype == torch.float16:  # no reduction: bit for bit
        assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k)
    else:  # fp32: the compiler may fuse a product into the sum
        _close(got_q, want_q, dtype)
        _close(got_k, want_k, dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize(
    "hq, hkv, dh", [(4, 2, 32), (6, 3, 24)]
)  # head counts and halves not powers of 2
def test_qk_norm_then_rope_matches_the_model(dtype, hq, hkv, dh):
    q, k, cos, sin = _qk(dtype, hq=hq, hkv=hkv, dh=dh, seed=hq)
    g = torch.Generator().manual_seed(9)
    qw, kw = (1 + 0.2 * torch.randn(2, dh, generator=g)).to(dtype)
    got_q, got_k = qk_norm_rope(q, k, cos, sin, qw, kw, 1e-6)
    want_q, want_k = qk_norm_rope_reference(q, k, cos, sin, qw, kw, 1e-6)
    model_q = apply_rope(model_rms_norm(q, qw, 1e-6), cos, sin)
    assert torch.equal(want_q, model_q)
    _close(got_q, want_q, dtype)
    _close(got_k, want_k, dtype)
    assert torch.equal(q, _qk(dtype, hq=hq, hkv=hkv, dh=dh, seed=hq)[0])  # inputs untouched


def test_q_and_k_may_be_views_of_a_fused_qkv_projection():
    q, k, cos, sin = _qk(torch.float16)  # [5, 4, 32], [5, 2, 32]
    qkv = torch.cat([q.flatten(1), k.flatten(1), k.flatten(1)], dim=1)  # rows 256 wide
    q_view = qkv[:, :128].view(5, 4, 32)
    k_view = qkv[:, 128:192].view(5, 2, 32)
    assert q_view.stride(0) == 256
    got_q, got_k = qk_norm_rope(q_view, k_view, cos, sin)
    want_q, want_k = qk_norm_rope_reference(q, k, cos, sin)
    assert got_q.is_contiguous() and torch.equal(got_q, want_q) and torch.equal(got_k, want_k)


def test_qk_norm_rope_refuses_mismatched_inputs():
    q, k, cos, sin = _qk(torch.float32)
    with pytest.raises(ValueError, match="same T and Dh"):
        qk_norm_rope(q, k[:3], cos, sin)
    with pytest.raises(ValueError, match="cos and sin must be"):
        qk_norm_rope(q, k, cos[:3], sin[:3])
    with pytest.raises(ValueError, match="or neither"):
        qk_norm_rope(q, k, cos, sin, torch.ones(32), None)
    with pytest.raises(ValueError, match="like q"):  # an fp32 weight beside fp16 q
        q16, k16, cos16, sin16 = _qk(torch.float16)
        qk_norm_rope(q16, k16, cos16, sin16, torch.ones(32), torch.ones(32))
