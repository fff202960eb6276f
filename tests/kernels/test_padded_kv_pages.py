"""The attention kernels on a padded KV view, under Triton's interpreter.

When a KV page does not divide the expert page the pool pads it to a larger slot and
views the KV pages as [P, slot] sliced to [P, 2, 16, Hkv, Dh]: the page stride is the
slot, not the page's own elements. Here the padding of every slot holds NaN, so a kernel
that assumed contiguous pages would read it and turn the output into NaN; each kernel on
the padded view must equal the torch reference on a contiguous copy of the same pages.
"""

import itertools

import torch

from rimuru.kernels import (
    paged_decode_attention,
    paged_decode_attention_reference,
    paged_prefill_attention,
    paged_prefill_attention_reference,
    write_kv_pages,
    write_kv_pages_reference,
)

H_KV, DH, NUM_PAGES = 2, 16, 12
PAGE_ELEMS = 2 * 16 * H_KV * DH  # 1024
SLOT_ELEMS = PAGE_ELEMS + 3 * 64  # padded: the view's page stride


def _padded_kv(gen: torch.Generator) -> torch.Tensor:
    slots = torch.full((NUM_PAGES, SLOT_ELEMS), float("nan"))
    slots[:, :PAGE_ELEMS] = torch.randn(NUM_PAGES, PAGE_ELEMS, generator=gen)
    kv = slots[:, :PAGE_ELEMS].view(NUM_PAGES, 2, 16, H_KV, DH)
    assert kv.stride(0) == SLOT_ELEMS and not kv.is_contiguous()
    return kv


def _tables(seq_lens: list[int], gen: torch.Generator) -> torch.Tensor:
    blocks = [(n + 15) // 16 for n in seq_lens]
    ids = torch.randperm(NUM_PAGES, generator=gen).int()
    tables = torch.zeros(len(seq_lens), max(blocks), dtype=torch.int32)
    used = 0
    for s, n in enumerate(blocks):
        tables[s, :n] = ids[used : used + n]
        used += n
    return tables


def test_kv_write_into_padded_pages_leaves_the_padding_alone():
    gen = torch.Generator().manual_seed(21)
    kv = _padded_kv(gen)
    expected = kv.contiguous()
    k, v = torch.randn(2, 30, H_KV, DH, generator=gen)
    slots = torch.randperm(NUM_PAGES * 16, generator=gen)[:30]
    slots[::7] = -1
    write_kv_pages(k, v, kv, slots)
    write_kv_pages_reference(k, v, expected, slots)
    assert torch.equal(kv, expected)
    padding = kv.as_strided((NUM_PAGES, SLOT_ELEMS - PAGE_ELEMS), (SLOT_ELEMS, 1), PAGE_ELEMS)
    assert bool(padding.isnan().all())


def test_decode_on_padded_pages_matches_reference_on_contiguous_pages():
    gen = torch.Generator().manual_seed(22)
    kv = _padded_kv(gen)
    seq_lens = [1, 17, 64, 40]
    tables = _tables(seq_lens, gen)
    q = torch.randn(len(seq_lens), 4, DH, generator=gen)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    out = paged_decode_attention(q, kv, tables, lens, max(seq_lens), tokens_per_split=64)
    ref = paged_decode_attention_reference(q, kv.contiguous(), tables, lens)
    assert out.isfinite().all()
    assert torch.allclose(out, ref, rtol=1e-5, atol=1e-6)


def test_prefill_on_padded_pages_matches_reference_on_contiguous_pages():
    gen = torch.Generator().manual_seed(23)
    kv = _padded_kv(gen)
    chunks = [(20, 9), (0, 23), (40, 1)]  # (cached before this chunk, chunk length)
    seq_lens = [c + n for c, n in chunks]
    tables = _tables(seq_lens, gen)
    cu = torch.tensor([0, *itertools.accumulate(n for _, n in chunks)], dtype=torch.int32)
    q = torch.randn(int(cu[-1]), 4, DH, generator=gen)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    max_q = max(n for _, n in chunks)
    out = paged_prefill_attention(q, kv, tables, cu, lens, max_q, block_m=16, block_n=16)
    ref = paged_prefill_attention_reference(q, kv.contiguous(), tables, cu, lens)
    assert out.isfinite().all()
    assert torch.allclose(out, ref, rtol=1e-5, atol=1e-6)
