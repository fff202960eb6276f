"""gated_delta_decode under Triton's interpreter: the kernel against its torch reference and
against the model's gated delta rule (dataplane/model/hybrid/gated_delta.py), on padded pages.

The pool views its state pages as [P, slot] sliced to [P, Hv, Dk, Dv]: the page stride is
the slot. Every slot's padding holds NaN here, so a kernel that stepped pages by their own
size would read it into a state; and every element no row owns (other pages, the padding)
must come back bit-identical.
"""

import pytest
import torch
import torch.nn.functional as F

from rimuru.dataplane.model.hybrid.gated_delta import chunked, recurrent
from rimuru.kernels import gated_delta_decode, gated_delta_decode_reference

HK, HV, NUM_PAGES = 2, 4, 8  # GQA: value head h reads key head h // 2
DK, DV = 96, 80  # not powers of two; Dk pads to 128, so Dv spans two 64-wide value tiles
PAGE = HV * DK * DV
SLOT = PAGE + 40


def _padded_states(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(slots [P, SLOT], states view [P, Hv, Dk, Dv] into it), padding NaN."""
    slots = torch.full((NUM_PAGES, SLOT), float("nan"))
    slots[:, :PAGE] = 0.1 * torch.randn(NUM_PAGES, PAGE, generator=gen)
    states = slots[:, :PAGE].view(NUM_PAGES, HV, DK, DV)
    assert states.stride(0) == SLOT
    return slots, states


def _token(num_seqs: int, gen: torch.Generator, dtype: torch.dtype = torch.float32):
    """q, k (L2-normalised), v, g, beta of one decode token per sequence."""
    q, k = (F.normalize(torch.randn(num_seqs, HK, DK, generator=gen), dim=-1) for _ in range(2))
    v = torch.randn(num_seqs, HV, DV, generator=gen)
    g = -torch.rand(num_seqs, HV, generator=gen)
    beta = torch.rand(num_seqs, HV, generator=gen)
    return q.to(dtype), k.to(dtype), v.to(dtype), g, beta


def _assert_rest_bit_identical(slots, before, pages) -> None:
    """Every element outside the written pages' [Hv, Dk, Dv] is as it was, NaN included."""
    written = torch.zeros(slots.shape, dtype=torch.bool)
    written[[p for p in pages if p >= 0], :PAGE] = True
    assert torch.equal(slots.view(torch.int32)[~written], before.view(torch.int32)[~written])


@pytest.mark.parametrize(
    ("dtype", "page_dtype", "atol"),
    [(torch.float32, torch.int32, 1e-6), (torch.float16, torch.int64, 1e-3)],
)
def test_decode_matches_reference_and_recurrent_on_padded_pages(dtype, page_dtype, atol):
    gen = torch.Generator().manual_seed(1)
    slots, states = _padded_states(gen)
    before = slots.clone()
    start = before[:, :PAGE].view(NUM_PAGES, HV, DK, DV)
    pages = [5, 0, -1, 3, 6]  # out of order, with gaps and a padding row
    q, k, v, g, beta = _token(len(pages), gen, dtype)
    qk = torch.cat((q, k), dim=-1)  # q and k as slices of one projection: strided rows
    q, k = qk[..., :DK], qk[..., DK:]
    g[2] = beta[2] = float("nan")  # a padding row's inputs are never read
    state_pages = torch.tensor(pages, dtype=page_dtype)

    o = gated_delta_decode(q, k, v, g, beta, states, state_pages)

    assert o.dtype == dtype and o.shape == v.shape
    assert torch.equal(o[2], torch.zeros(HV, DV, dtype=dtype))
    _assert_rest_bit_identical(slots, before, pages)
    expected_states = start.clone()
    o_ref = gated_delta_decode_reference(q, k, v, g, beta, expected_states, state_pages)
    torch.testing.assert_close(o, o_ref, rtol=0, atol=atol)
    for s, page in enumerate(pages):
        if page < 0:
            continue
        rows = slice(s, s + 1)
        o_model, state_model = recurrent(
            q[rows], k[rows], v[rows], g[rows], beta[rows], start[page].clone()
        )
        torch.testing.assert_close(o[s], o_model[0].to(dtype), rtol=0, atol=atol)
        torch.testing.assert_close(states[page], state_model, rtol=0, atol=1e-6)
        torch.testing.assert_close(states[page], expected_states[page], rtol=0, atol=1e-6)


def test_all_padding_rows_write_nothing_and_give_zeros():
    gen = torch.Generator().manual_seed(2)
    slots, states = _padded_states(gen)
    before = slots.clone()
    q, k, v, g, beta = _token(3, gen)
    o = gated_delta_decode(q, k, v, g, beta, states, torch.full((3,), -1, dtype=torch.int32))
    assert torch.equal(o, torch.zeros_like(v))
    _assert_rest_bit_identical(slots, before, [])


def test_chunked_prefill_then_decode_steps_equal_the_whole_sequence():
    """The state a prefill leaves in a page (model's chunked form), carried through kernel
    decode steps, gives the outputs and final state of the whole sequence token by token."""
    gen = torch.Generator().manual_seed(3)
    _, states = _padded_states(gen)
    prompt_lens, steps, pages = [0, 5, 3], 4, [6, 1, 4]  # 0: decode from a zeroed page
    total = [n + steps for n in prompt_lens]
    seqs = [_token(n, gen) for n in total]
    scale = 0.3
    for (q, k, v, g, beta), n, page in zip(seqs, prompt_lens, pages, strict=True):
        if n == 0:  # a new sequence: the caller zeroes its page
            states[page] = 0.0
            continue
        _, prefilled = chunked(q[:n], k[:n], v[:n], g[:n], beta[:n], scale=scale, chunk_size=4)
        states[page] = prefilled
    state_pages = torch.tensor(pages, dtype=torch.int32)
    outs = []
    for i in range(steps):
        step = [torch.stack([x[n + i] for x, n in zip(xs, prompt_lens, strict=True)])
                for xs in zip(*seqs, strict=True)]  # fmt: skip
        outs.append(gated_delta_decode(*step, states, state_pages, scale=scale))
    for s, (seq, n, page) in enumerate(zip(seqs, prompt_lens, pages, strict=True)):
        o_whole, state_whole = recurrent(*seq, scale=scale)
        torch.testing.assert_close(
            torch.stack([o[s] for o in outs]), o_whole[n:], rtol=0, atol=1e-5
        )
        torch.testing.assert_close(states[page], state_whole, rtol=0, atol=1e-5)


def _bad(**change):
    gen = torch.Generator().manual_seed(4)
    _, states = _padded_states(gen)
    q, k, v, g, beta = _token(2, gen)
    args = dict(q=q, k=k, v=v, g=g, beta=beta, states=states)
    args["state_pages"] = torch.tensor([0, 1], dtype=torch.int32)
    return {**args, **change}


@pytest.mark.parametrize(
    "args",
    [
        _bad(states=torch.zeros(NUM_PAGES, HV, DK, DV, dtype=torch.float16)),  # not fp32
        _bad(states=torch.zeros(NUM_PAGES, HV, DV, DK).transpose(2, 3)),  # page not contiguous
        _bad(v=torch.zeros(2, 3, DV)),  # Hv not a multiple of Hk
        _bad(g=torch.zeros(2, HV, dtype=torch.float16)),
        _bad(beta=torch.zeros(2, HV)[:1]),
        _bad(q=torch.zeros(2, HK, 2 * DK)[:, :, ::2]),  # head dim strided
        _bad(state_pages=torch.tensor([0.0, 1.0])),
        _bad(state_pages=torch.tensor([0, 1, 2], dtype=torch.int32)[::2]),
        _bad(state_pages=torch.tensor([0], dtype=torch.int32)),
        _bad(
            q=torch.zeros(2, HK, 512),
            k=torch.zeros(2, HK, 512),
            states=torch.zeros(NUM_PAGES, HV, 512, DV),
        ),  # Dk above the register tile
    ],
)
def test_launcher_rejects_misuse(args):
    with pytest.raises(ValueError):
        gated_delta_decode(**args)
