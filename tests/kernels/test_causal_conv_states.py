"""causal_conv_decode / causal_conv_prefill under Triton's interpreter: the kernels against
their torch references and against the model's causal_conv1d (dataplane/model/hybrid/causal_conv.py),
on padded pages.

The pool views its state pages as [P, slot] sliced to [P, C, K-1]: the page stride is the
slot. Every slot's padding holds NaN here, so a kernel that stepped pages by their own size
would read it; and every element no sequence owns (other pages, the padding) must come back
bit-identical.
"""

import itertools

import pytest
import torch

from rimuru.dataplane.model.hybrid.causal_conv import causal_conv1d
from rimuru.kernels import (
    causal_conv_decode,
    causal_conv_decode_reference,
    causal_conv_prefill,
    causal_conv_prefill_reference,
)

C, K, NUM_PAGES = 300, 4, 8  # C over two decode and three prefill channel tiles
PAGE = C * (K - 1)
SLOT = PAGE + 24
# fp16: the kernel's fp32 sum and F.conv1d's may round to neighbouring halves
TOLERANCE = {torch.float32: dict(rtol=1e-5, atol=1e-6), torch.float16: dict(rtol=2e-3, atol=1e-3)}
CASES = [(torch.float32, torch.int32), (torch.float16, torch.int64)]


def _padded_states(gen: torch.Generator, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(slots [P, SLOT], states view [P, C, K-1] into it), random states, padding NaN."""
    slots = torch.full((NUM_PAGES, SLOT), float("nan"), dtype=dtype)
    slots[:, :PAGE] = torch.randn(NUM_PAGES, PAGE, generator=gen)
    states = slots[:, :PAGE].view(NUM_PAGES, C, K - 1)
    assert states.stride(0) == SLOT
    return slots, states


def _assert_rest_bit_identical(slots, before, pages) -> None:
    """Every element outside the written pages' [C, K-1] is as it was, NaN included."""
    written = torch.zeros(slots.shape, dtype=torch.bool)
    written[[p for p in pages if p >= 0], :PAGE] = True
    as_int = {2: torch.int16, 4: torch.int32}[slots.element_size()]
    assert torch.equal(slots.view(as_int)[~written], before.view(as_int)[~written])


def _weight(gen: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    return (0.5 * torch.randn(C, K, generator=gen)).to(dtype)


def _pages_and_weight(seed: int, dtype: torch.dtype):
    """gen, slots, states (a view into slots), a copy of the slots and of the states before
    any call, and a conv weight."""
    gen = torch.Generator().manual_seed(seed)
    slots, states = _padded_states(gen, dtype)
    before = slots.clone()
    start = before[:, :PAGE].view(NUM_PAGES, C, K - 1)
    return gen, slots, states, before, start, _weight(gen, dtype)


@pytest.mark.parametrize(("dtype", "page_dtype"), CASES)
def test_decode_matches_reference_and_model_on_padded_pages(dtype, page_dtype):
    gen, slots, states, before, start, weight = _pages_and_weight(11, dtype)
    pages = [5, 0, -1, 3]  # out of order, with gaps and a padding row
    x = torch.randn(len(pages), 2 * C, generator=gen).to(dtype)[:, :C]  # strided rows
    x[2] = float("nan")  # a padding row's input is never read
    state_pages = torch.tensor(pages, dtype=page_dtype)

    out = causal_conv_decode(x, weight, states, state_pages)

    assert out.dtype == dtype and torch.equal(out[2], torch.zeros(C, dtype=dtype))
    _assert_rest_bit_identical(slots, before, pages)
    expected_states = start.clone()
    out_ref = causal_conv_decode_reference(x, weight, expected_states, state_pages)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out, out_ref, **tol)
    assert torch.equal(states, expected_states)  # a state is inputs moved, never rounded
    for s, page in enumerate(pages):
        if page >= 0:
            out_model, state_model = causal_conv1d(x[s : s + 1], weight, start[page])
            torch.testing.assert_close(out[s], out_model[0], **tol)
            assert torch.equal(states[page], state_model)


@pytest.mark.parametrize(("dtype", "page_dtype"), CASES)
def test_prefill_matches_reference_and_model_on_padded_pages(dtype, page_dtype):
    """Chunks of 1 and 2 tokens (< K - 1) keep part of their old state; one sequence pads."""
    gen, slots, states, before, start, weight = _pages_and_weight(12, dtype)
    # The 37-row sequence fills token tiles past every sequence's first K - 1 rows: the
    # kernel's path that reads no state.
    lens, pages = [1, 2, 5, 3, 37], [5, 0, 7, -1, 2]
    cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32)
    x = torch.randn(sum(lens), C, generator=gen).to(dtype)
    state_pages = torch.tensor(pages, dtype=page_dtype)

    out = causal_conv_prefill(x, weight, states, state_pages, cu)

    assert torch.equal(out[8:11], torch.zeros(3, C, dtype=dtype))  # the padding sequence
    _assert_rest_bit_identical(slots, before, pages)
    expected_states = start.clone()
    out_ref = causal_conv_prefill_reference(x, weight, expected_states, state_pages, cu)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out, out_ref, **tol)
    assert torch.equal(states, expected_states)
    for s, page in enumerate(pages):
        if page >= 0:
            rows = slice(cu[s], cu[s + 1])
            out_model, state_model = causal_conv1d(x[rows], weight, start[page])
            torch.testing.assert_close(out[rows], out_model, **tol)
            assert torch.equal(states[page], state_model)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_prefill_prefill_then_decode_steps_equal_the_whole_sequence(dtype):
    """New sequences (zeroed pages) split anywhere convolve as when whole."""
    gen = torch.Generator().manual_seed(13)
    _, states = _padded_states(gen, dtype)
    weight = _weight(gen, dtype)
    chunks, steps, pages = [(2, 1), (7, 2), (1, 5)], 3, [4, 1, 6]  # (first, second) chunk
    seqs = [torch.randn(a + b + steps, C, generator=gen).to(dtype) for a, b in chunks]
    states[pages] = 0  # the caller zeroes a new sequence's page
    state_pages = torch.tensor(pages, dtype=torch.int32)
    outs = [[] for _ in seqs]
    for bounds in ((0, 1), (1, 2)):  # rows of each sequence's first, then second chunk
        ends = [[0, a, a + b] for a, b in chunks]
        parts = [x[e[bounds[0]] : e[bounds[1]]] for x, e in zip(seqs, ends, strict=True)]
        cu = torch.tensor([0, *itertools.accumulate(len(p) for p in parts)], dtype=torch.int32)
        out = causal_conv_prefill(torch.cat(parts), weight, states, state_pages, cu)
        for s in range(len(seqs)):
            outs[s].append(out[cu[s] : cu[s + 1]])
    for i in range(steps):
        x = torch.stack([x[a + b + i] for x, (a, b) in zip(seqs, chunks, strict=True)])
        out = causal_conv_decode(x, weight, states, state_pages)
        for s in range(len(seqs)):
            outs[s].append(out[s : s + 1])
    for s, (x, page) in enumerate(zip(seqs, pages, strict=True)):
        out_whole, state_whole = causal_conv1d(x, weight)
        torch.testing.assert_close(torch.cat(outs[s]), out_whole, **TOLERANCE[dtype])
        assert torch.equal(states[page], state_whole)


def _bad(**change):
    gen = torch.Generator().manual_seed(14)
    _, states = _padded_states(gen, torch.float32)
    args = dict(x=torch.randn(2, C, generator=gen), weight=_weight(gen, torch.float32))
    args.update(states=states, state_pages=torch.tensor([0, 1], dtype=torch.int32))
    return {**args, **change}


@pytest.mark.parametrize(
    "args",
    [
        _bad(states=torch.zeros(NUM_PAGES, C, K - 1, dtype=torch.float16)),  # not x's dtype
        _bad(states=torch.zeros(NUM_PAGES, K - 1, C).transpose(1, 2)),  # page not contiguous
        _bad(weight=torch.zeros(C, 1)),  # K = 1 has no state
        _bad(x=torch.zeros(2, 2 * C)[:, ::2]),  # channels strided
        _bad(state_pages=torch.tensor([0, 1])[:1]),
    ],
)
def test_launchers_reject_misuse(args):
    with pytest.raises(ValueError):
        causal_conv_decode(**args)
    with pytest.raises(ValueError):
        causal_conv_prefill(**args, cu_seqlens=torch.tensor([0, 1, 2], dtype=torch.int32))


def test_prefill_rejects_cu_seqlens_that_do_not_match_the_pages():
    args = _bad()
    for cu in (torch.tensor([0, 2], dtype=torch.int32), torch.tensor([0, 1, 2])):
        with pytest.raises(ValueError):
            causal_conv_prefill(**args, cu_seqlens=cu)
