"""Paged attention kernels vs their torch references, under Triton's interpreter.

Shape key: B/S = sequences, T = tokens, Hq/Hkv = heads, Dh = head size, P = KV pages.
Every sequence's pages are scattered through a pool whose other pages hold NaN, so a wrong
block-table lookup shows up as NaN; outputs are NaN-poisoned before each run.
"""

import itertools

import pytest
import torch

from rimuru.kernels import (
    paged_decode_attention,
    paged_decode_attention_reference,
    paged_prefill_attention,
    paged_prefill_attention_reference,
    write_kv_pages,
    write_kv_pages_reference,
)

TOLERANCE = {torch.float32: 1e-5, torch.float16: 3e-3}


def _pool_and_tables(seq_lens: list[int], h_kv: int, dh: int, dtype, seed: int):
    """KV pool [P, 2, 16, Hkv, Dh] with each sequence's pages at random ids; spare pages NaN."""
    gen = torch.Generator().manual_seed(seed)
    blocks = [(n + 15) // 16 for n in seq_lens]
    num_pages = sum(blocks) + 7
    kv = torch.full((num_pages, 2, 16, h_kv, dh), float("nan"), dtype=dtype)
    ids = torch.randperm(num_pages, generator=gen)
    tables = torch.zeros(len(seq_lens), max(blocks), dtype=torch.int32)
    used = 0
    for s, n in enumerate(blocks):
        tables[s, :n] = ids[used : used + n].int()
        used += n
    for s, n in enumerate(seq_lens):
        # Only the tokens that exist get values; the tail of a last page stays NaN.
        k = torch.randn(n, h_kv, dh, generator=gen).to(dtype)
        v = torch.randn(n, h_kv, dh, generator=gen).to(dtype)
        pos = torch.arange(n)
        slots = tables[s, pos // 16].long() * 16 + pos % 16
        write_kv_pages_reference(k, v, kv, slots)
    return kv, tables


def _rel_err(out, ref):
    return float((out.float() - ref.float()).norm() / ref.float().norm())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_kv_write_matches_reference_and_skips_negative_slots(dtype):
    gen = torch.Generator().manual_seed(1)
    h_kv, dh, T = 2, 16, 40
    kv = torch.full((6, 2, 16, h_kv, dh), float("nan"), dtype=dtype)
    expected = kv.clone()
    qkv = torch.randn(T, 3 * h_kv * dh, generator=gen).to(dtype)  # a fused projection
    k = qkv[:, h_kv * dh : 2 * h_kv * dh].view(T, h_kv, dh)  # row-strided views
    v = qkv[:, 2 * h_kv * dh :].view(T, h_kv, dh)
    slots = torch.randperm(6 * 16, generator=gen)[:T]
    slots[::5] = -1
    write_kv_pages(k, v, kv, slots)
    write_kv_pages_reference(k, v, expected, slots)
    assert torch.equal(kv.isnan(), expected.isnan())
    assert torch.equal(kv.nan_to_num(7.0), expected.nan_to_num(7.0))
    assert kv.isfinite().sum() == 2 * (T - len(range(0, T, 5))) * h_kv * dh


@pytest.mark.parametrize(
    ("dtype", "hq", "h_kv", "tokens_per_split"),
    [
        (torch.float32, 4, 4, None),  # no GQA, one split
        (torch.float16, 8, 2, 64),  # GQA 4, split context merged by log-sum-exp
        (torch.float16, 8, 1, None),  # MQA
        (torch.float32, 6, 2, 128),  # group of 3 (padded to 16 rows)
    ],
)
def test_decode_matches_reference(dtype, hq, h_kv, tokens_per_split):
    seq_lens = [1, 16, 17, 200, 64]
    kv, tables = _pool_and_tables(seq_lens, h_kv, 32, dtype, seed=hq)
    q = torch.randn(len(seq_lens), hq, 32, generator=torch.Generator().manual_seed(3)).to(dtype)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    out = torch.full_like(q, float("nan"))
    paged_decode_attention(
        q, kv, tables, lens, max(seq_lens), out=out, tokens_per_split=tokens_per_split
    )
    ref = paged_decode_attention_reference(q, kv, tables, lens)
    assert out.isfinite().all()
    assert _rel_err(out, ref) < TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_chunked_prefill_matches_reference(dtype):
    # (cached before this chunk, chunk length): later chunks of prompts, a fresh prompt,
    # a one-token chunk, and a chunk longer than one query tile.
    chunks = [(40, 9), (0, 23), (100, 1), (16, 37)]
    seq_lens = [c + n for c, n in chunks]
    kv, tables = _pool_and_tables(seq_lens, 2, 16, dtype, seed=5)
    cu = torch.tensor([0, *itertools.accumulate(n for _, n in chunks)], dtype=torch.int32)
    q = torch.randn(int(cu[-1]), 4, 16, generator=torch.Generator().manual_seed(6)).to(dtype)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    out = torch.full_like(q, float("nan"))
    max_q = max(n for _, n in chunks)
    paged_prefill_attention(q, kv, tables, cu, lens, max_q, out=out, block_m=16, block_n=16)
    ref = paged_prefill_attention_reference(q, kv, tables, cu, lens)
    assert out.isfinite().all()
    assert _rel_err(out, ref) < TOLERANCE[dtype]


def test_prefill_of_one_token_equals_decode():
    kv, tables = _pool_and_tables([30, 5], 2, 16, torch.float32, seed=7)
    q = torch.randn(2, 4, 16, generator=torch.Generator().manual_seed(8))
    lens = torch.tensor([30, 5], dtype=torch.int32)
    cu = torch.tensor([0, 1, 2], dtype=torch.int32)
    prefill = paged_prefill_attention(q, kv, tables, cu, lens, 1, block_m=16, block_n=16)
    decode = paged_decode_attention(q, kv, tables, lens, 30)
    assert torch.allclose(prefill, decode, rtol=1e-5, atol=1e-6)


def test_bad_attention_input_is_refused():
    kv = torch.zeros(4, 2, 16, 2, 16)
    q = torch.zeros(3, 4, 16)
    tables = torch.zeros(3, 2, dtype=torch.int32)
    lens = torch.ones(3, dtype=torch.int32)
    with pytest.raises(ValueError, match="kv_pages must be"):
        paged_decode_attention(q, torch.zeros(4, 2, 8, 2, 16), tables, lens, 1)
    with pytest.raises(ValueError, match="multiple of Hkv"):
        paged_decode_attention(torch.zeros(3, 3, 16), kv, tables, lens, 1)
    with pytest.raises(ValueError, match="block_tables must be int32"):
        paged_decode_attention(q, kv, tables.long(), lens, 1)
    with pytest.raises(ValueError, match="seq_lens must be int32"):
        paged_decode_attention(q, kv, tables, lens.long(), 1)
    with pytest.raises(ValueError, match="power of two"):
        paged_decode_attention(torch.zeros(3, 4, 24), torch.zeros(4, 2, 16, 2, 24), tables, lens, 1)
    with pytest.raises(ValueError, match="cu_seqlens_q must be int32"):
        paged_prefill_attention(q, kv, tables, torch.zeros(3, dtype=torch.int32), lens, 1)
    with pytest.raises(ValueError, match="slots must be int64"):
        write_kv_pages(q[:, :2], q[:, :2], kv, torch.zeros(3, dtype=torch.int32))
    with pytest.raises(ValueError, match="unit stride"):  # a layer's row of a [T, L] layout
        write_kv_pages(q[:, :2], q[:, :2], kv, torch.zeros(3, 2, dtype=torch.int64)[:, 0])


def test_one_block_table_row_is_accepted_whatever_its_column_stride():
    # a [1, 1] slice of a [L, 1, 1] table made by permute has strides (L, L); the column
    # stride is never read, so decode must accept it and match the reference
    kv, tables = _pool_and_tables([9], 2, 16, torch.float32, seed=11)
    odd = tables.expand(24, 1, 1).permute(1, 2, 0).contiguous().permute(2, 0, 1)[3]
    assert odd.shape == (1, 1) and odd.stride(1) != 1
    q = torch.randn(1, 4, 16, generator=torch.Generator().manual_seed(12))
    lens = torch.tensor([9], dtype=torch.int32)
    out = paged_decode_attention(q, kv, odd, lens, 9)
    ref = paged_decode_attention_reference(q, kv, tables, lens)
    assert _rel_err(out, ref) < TOLERANCE[torch.float32]
    with pytest.raises(ValueError, match="unit column stride"):
        paged_decode_attention(q, kv, torch.zeros(1, 4, dtype=torch.int32)[:, ::2], lens, 9)
