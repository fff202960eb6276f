"""Sampler semantics on fixed logits."""

import torch

from rimuru.dataplane.engine.request import SamplingParams
from rimuru.dataplane.engine.sampling import Sampler

LOGITS = torch.tensor([3.0, 2.5, 2.0, -1.0, -2.0])  # probabilities ~ .48 .29 .18 .02 .01


def draws(params: SamplingParams, n: int = 300) -> set[int]:
    sampler = Sampler()
    return {sampler.sample(LOGITS[None], [f"r{i}"], [params])[0] for i in range(n)}


def test_greedy_rows_are_one_batched_argmax_and_mixed_batches_keep_order():
    logits = torch.stack([LOGITS, LOGITS.flip(0), LOGITS])
    params = [SamplingParams(), SamplingParams(), SamplingParams(temperature=1.0, top_k=1)]
    assert Sampler().sample(logits, ["a", "b", "c"], params) == [0, 4, 0]


def test_top_k_and_top_p_restrict_the_support():
    assert draws(SamplingParams(temperature=1.0, top_k=2)) == {0, 1}
    assert draws(SamplingParams(temperature=1.0, top_p=0.4)) == {0}
    assert draws(SamplingParams(temperature=1.0, top_p=0.9)) == {0, 1, 2}
    assert draws(SamplingParams(temperature=1.0)) >= {0, 1, 2}


def test_seeded_requests_repeat_exactly():
    p = SamplingParams(temperature=1.5, seed=11)
    first = [Sampler().sample(LOGITS[None], ["x"], [p])[0] for _ in range(1)]
    s1, s2 = Sampler(), Sampler()
    a = [s1.sample(LOGITS[None], ["x"], [p])[0] for _ in range(20)]
    b = [s2.sample(LOGITS[None], ["x"], [p])[0] for _ in range(20)]
    assert a == b and a[0] == first[0] and len(set(a)) > 1


def test_a_seeded_request_draws_the_same_tokens_alone_and_in_a_batch():
    p = SamplingParams(temperature=1.2, top_p=0.95, seed=3)
    alone = Sampler()
    solo = [alone.sample(LOGITS[None], ["x"], [p])[0] for _ in range(15)]
    batched, together = Sampler(), []
    others = [
        SamplingParams(),
        SamplingParams(temperature=0.7, top_k=3),
        SamplingParams(temperature=1.0, seed=9),
    ]
    logits = torch.stack([LOGITS.flip(0), LOGITS, LOGITS.roll(1), LOGITS])
    for _ in range(15):
        out = batched.sample(logits, ["g", "x", "u", "s"], [others[0], p, others[1], others[2]])
        assert out[0] == 4  # the greedy row: argmax of the flipped logits
        together.append(out[1])
    assert together == solo and len(set(solo)) > 1
