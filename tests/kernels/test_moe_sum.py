"""moe_sum == torch.sum over each token's top-k rows, under Triton's interpreter."""

import pytest
import torch

from rimuru.kernels.moe_sum import moe_sum, moe_sum_reference


@pytest.mark.parametrize(
    ("dtype", "tokens", "top_k", "hidden"),
    [
        (torch.float32, 1, 2, 64),
        (torch.float32, 7, 3, 100),  # K not a power of two, D not a multiple of the block
        (torch.float16, 5, 8, 2048),  # several column blocks
        (torch.float16, 3, 1, 48),
    ],
)
def test_moe_sum_adds_each_tokens_rows(dtype, tokens, top_k, hidden):
    gen = torch.Generator().manual_seed(tokens * 10 + top_k)
    y = torch.randn(tokens * top_k, hidden, generator=gen).to(dtype)
    out = torch.full((tokens, hidden), float("nan"), dtype=dtype)
    moe_sum(y, out, top_k)
    exact = y.float().view(tokens, top_k, hidden).sum(1)
    # One rounding of an fp32 sum: within half an ulp of the dtype, plus fp32 order effects.
    tol = {torch.float32: 1e-5, torch.float16: 2e-3}[dtype]
    torch.testing.assert_close(out.float(), exact, rtol=tol, atol=tol)
    torch.testing.assert_close(out, moe_sum_reference(y, top_k), rtol=tol, atol=tol)
