"""The one-launch sampler kernel (kernels/exponential_race.py) under the interpreter."""

import pytest
import torch

from rimuru.kernels.exponential_race import exponential_race


def test_greedy_rows_take_the_first_argmax_across_blocks():
    vocab = 2500  # three blocks of 1024, the last one partial
    logits = torch.randn(4, vocab, generator=torch.Generator().manual_seed(0))
    logits[1, [7, 1500, 2400]] = 50.0  # a tie across blocks: the lowest index wins
    logits[2, 2499] = 50.0  # the last token of the partial block
    logits[3] = 1.0  # all tied: token 0
    got = exponential_race(logits, torch.zeros(4), torch.arange(4))
    assert got.tolist() == [int(logits[0].argmax()), 7, 2499, 0]


def test_draws_follow_softmax_over_temperature():
    rows, logits = 400, torch.tensor([0.0, 1.0, 2.0, -1.0, 0.5])
    for temperature in (1.0, 0.5):
        got = exponential_race(
            logits.expand(rows, -1).contiguous(),
            torch.full((rows,), 1 / temperature),
            torch.arange(rows) * 7919 + 13,
        )
        freq = torch.bincount(got, minlength=5) / rows
        want = torch.softmax(logits / temperature, dim=-1)
        # standard error <= 0.025 per token; the keys are fixed, so this never flakes
        assert torch.allclose(freq, want, atol=0.08), (temperature, freq, want)


def test_a_draw_depends_on_its_key_and_logits_not_its_row():
    logits = torch.randn(6, 700, generator=torch.Generator().manual_seed(1))
    inv_t, keys = torch.full((6,), 1.3), torch.tensor([5, 9, 5, 11, 2, 9])
    got = exponential_race(logits, inv_t, keys)
    order = torch.tensor([3, 0, 5, 1, 4, 2])
    shuffled = exponential_race(logits[order], inv_t[order], keys[order])
    assert shuffled.tolist() == got[order].tolist()
    many = {int(exponential_race(logits[:1], inv_t[:1], torch.tensor([k]))) for k in range(30)}
    assert len(many) > 10  # keys change the draw: not an argmax in disguise


def test_tokens_outside_the_support_never_win():
    logits = torch.full((50, 40), float("-inf"))
    logits[:, [3, 17, 39]] = torch.tensor([0.0, 0.5, 1.0])
    got = exponential_race(logits, torch.ones(50), torch.arange(50))
    assert set(got.tolist()) == {3, 17, 39}


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="unit stride"):
        exponential_race(torch.zeros(4, 3).t(), torch.ones(3), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"must be \[2\]"):
        exponential_race(torch.zeros(2, 3), torch.ones(3), torch.zeros(2, dtype=torch.long))
