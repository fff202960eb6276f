"""Sampler semantics on fixed logits, on both paths: the torch path and the one-launch race
(kernels/exponential_race.py, under TRITON_INTERPRET on the CPU)."""

import math
from dataclasses import replace

import pytest
import torch

from rimuru.dataplane.engine.forward.sampling import SAMPLING_EPS, Sampler, limit_support
from rimuru.dataplane.engine.sched.request import SamplingParams

LOGITS = torch.tensor([3.0, 2.5, 2.0, -1.0, -2.0])  # probabilities ~ .48 .29 .18 .02 .01


@pytest.fixture(params=[False, True], ids=["torch", "race"])
def race(request) -> bool:
    return request.param


def draws(params: SamplingParams, race: bool) -> set[int]:
    """The tokens drawn by fresh requests (the interpreted race is slow: fewer of them)."""
    sampler, n = Sampler(race=race), 60 if race else 300
    torch.manual_seed(0)  # the unseeded rows' global generator: the test is deterministic
    return {sampler.sample(LOGITS[None], [f"r{i}"], [params])[0] for i in range(n)}


def test_greedy_rows_are_one_batched_argmax_and_mixed_batches_keep_order(race):
    logits = torch.stack([LOGITS, LOGITS.flip(0), LOGITS])
    params = [SamplingParams(), SamplingParams(), SamplingParams(temperature=1.0, top_k=1)]
    assert Sampler(race=race).sample(logits, ["a", "b", "c"], params) == [0, 4, 0]


def test_top_k_and_top_p_restrict_the_support(race):
    assert draws(SamplingParams(temperature=1.0, top_k=2), race) == {0, 1}
    assert draws(SamplingParams(temperature=1.0, top_p=0.4), race) == {0}
    assert draws(SamplingParams(temperature=1.0, top_p=0.9), race) == {0, 1, 2}
    assert draws(SamplingParams(temperature=1.0), race) >= {0, 1, 2}


def test_seeded_requests_repeat_exactly(race):
    p = SamplingParams(temperature=1.5, seed=11)
    first = [Sampler(race=race).sample(LOGITS[None], ["x"], [p])[0] for _ in range(1)]
    s1, s2 = Sampler(race=race), Sampler(race=race)
    a = [s1.sample(LOGITS[None], ["x"], [p])[0] for _ in range(20)]
    b = [s2.sample(LOGITS[None], ["x"], [p])[0] for _ in range(20)]
    assert a == b and a[0] == first[0] and len(set(a)) > 1


def test_a_seeded_request_draws_the_same_tokens_alone_and_in_a_batch(race):
    p = SamplingParams(temperature=1.2, top_p=0.95, seed=3)
    alone = Sampler(race=race)
    solo = [alone.sample(LOGITS[None], ["x"], [p])[0] for _ in range(15)]
    batched, together = Sampler(race=race), []
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


def _frequencies(logits: torch.Tensor, params: SamplingParams, n: int, seeded: bool):
    """Empirical token frequencies of n rows drawn in one batch (seeded: seeds 0..n-1)."""
    batch = [replace(params, seed=i) if seeded else params for i in range(n)]
    torch.manual_seed(0)  # the unseeded rows' global generator: the test is deterministic
    tokens = Sampler().sample(logits.expand(n, -1), [f"r{i}" for i in range(n)], batch)
    return torch.bincount(torch.tensor(tokens), minlength=logits.shape[-1]) / n


@pytest.mark.parametrize("seeded", [True, False], ids=["seeded", "unseeded"])
@pytest.mark.parametrize(
    ("params", "support"),
    [
        (SamplingParams(temperature=1.0), [0, 1, 2, 3, 4]),
        (SamplingParams(temperature=0.5), [0, 1, 2, 3, 4]),
        (SamplingParams(temperature=2.0), [0, 1, 2, 3, 4]),
        (SamplingParams(temperature=1.0, top_k=2), [0, 1]),
        (SamplingParams(temperature=1.0, top_p=0.9), [0, 1, 2]),
    ],
    ids=["t1", "t0.5", "t2", "top_k2", "top_p0.9"],
)
def test_draws_follow_the_softmax_of_the_support(params, support, seeded):
    n = 20_000  # standard error of each frequency <= 0.0036
    want = torch.zeros_like(LOGITS)
    want[support] = torch.softmax(LOGITS[support] / params.temperature, dim=-1)
    got = _frequencies(LOGITS, params, n, seeded)
    assert torch.allclose(got, want, atol=0.015), (got, want)


def _reference_support(row: list[float], top_k: int, top_p: float) -> set[int]:
    """Top-k then top-p written out one token at a time."""
    order = sorted(range(len(row)), key=lambda i: -row[i])
    k = top_k if 0 < top_k < len(row) else len(row)
    kept = [i for i in order if row[i] >= row[order[k - 1]]]
    mass = [math.exp(row[i]) for i in kept]
    support, before = set(), 0.0
    for i, m in zip(kept, mass, strict=True):
        if not support or top_p >= 1.0 or before < top_p:
            support.add(i)
        before += m / sum(mass)
    return support


def test_limit_support_keeps_exactly_top_k_and_top_p():
    generator = torch.Generator().manual_seed(0)
    distinct = torch.randn(6, 64, generator=generator) * 2
    tied = torch.randint(0, 8, (3, 64), generator=generator).float()  # many ties
    cases = [
        (distinct[0], 1, 1.0),
        (distinct[1], 5, 1.0),
        (distinct[2], 0, 0.5),
        (distinct[3], 10, 0.8),
        (distinct[4], -1, 0.95),
        (distinct[5], 64, 0.3),
        (tied[0], 3, 1.0),  # top-k keeps every tie at the k-th
        (tied[1], 20, 1.0),
        (tied[2], 1, 1.0),
    ]
    rows = torch.stack([row for row, _, _ in cases])
    params = [SamplingParams(temperature=1.0, top_k=k, top_p=p) for _, k, p in cases]
    top_k_only = [j for j, (_, _, p) in enumerate(cases) if p >= 1.0]
    together = limit_support(rows, params)  # one sort for all rows
    alone = limit_support(rows[top_k_only], [params[j] for j in top_k_only])  # top-k only
    for j, (row, k, p) in enumerate(cases):
        want = _reference_support(row.tolist(), k, p)
        assert set(torch.isfinite(together[j]).nonzero().flatten().tolist()) == want, j
        assert torch.equal(together[j][list(want)], row[list(want)])
    for a, j in enumerate(top_k_only):
        assert torch.equal(alone[a], together[j])


def _forbid(monkeypatch, *names: str) -> None:
    def forbidden(*args, **kwargs):
        raise AssertionError("the sampler sorted a row that asked for no top-k or top-p")

    for name in names:
        monkeypatch.setattr(torch, name, forbidden)
        monkeypatch.setattr(torch.Tensor, name, forbidden)


def test_plain_temperature_rows_are_never_sorted(monkeypatch, race):
    vocab = 1000
    logits = torch.randn(6, vocab, generator=torch.Generator().manual_seed(1))
    params = [
        SamplingParams(temperature=0.7),
        SamplingParams(temperature=1.0, seed=4),
        SamplingParams(),
        SamplingParams(temperature=0.5, top_k=-1, top_p=1.0),
        SamplingParams(temperature=1.0, top_k=vocab),  # k >= vocab keeps everything
        SamplingParams(temperature=1.0, top_k=vocab + 7, seed=2),
    ]
    _forbid(monkeypatch, "sort", "topk", "argsort", "multinomial")
    tokens = Sampler(race=race).sample(logits, [f"r{i}" for i in range(6)], params)
    assert len(tokens) == 6 and all(0 <= t < vocab for t in tokens)
    assert tokens[2] == int(torch.argmax(logits[2]))


def test_top_k_alone_takes_a_top_k_not_a_sort(monkeypatch, race):
    _forbid(monkeypatch, "sort", "argsort")
    assert draws(SamplingParams(temperature=1.0, top_k=2), race) == {0, 1}
    assert draws(SamplingParams(temperature=5.0, top_k=3), race) == {0, 1, 2}


def test_a_plain_seeded_request_ignores_its_batch_and_its_row(race):
    vocab = 500
    logits = torch.randn(5, vocab, generator=torch.Generator().manual_seed(2))
    p = SamplingParams(temperature=0.8, seed=42)
    alone = Sampler(race=race)
    solo = [alone.sample(logits[3:4], ["x"], [p])[0] for _ in range(25)]
    others = [
        SamplingParams(),
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.9, top_p=0.5, seed=7),
        SamplingParams(temperature=1.3, top_k=20),
    ]
    other_logits, other_ids = [logits[i] for i in (0, 1, 2, 4)], ["g", "u", "s", "k"]
    batched, together = Sampler(race=race), []
    for step in range(25):  # x moves between rows, among greedy, unseeded and limited rows
        row = step % 5
        rows = torch.stack([*other_logits[:row], logits[3], *other_logits[row:]])
        ids = [*other_ids[:row], "x", *other_ids[row:]]
        together.append(batched.sample(rows, ids, [*others[:row], p, *others[row:]])[row])
    assert together == solo and len(set(solo)) > 5


def test_greedy_rows_are_the_argmax_whatever_else_is_drawn(race):
    logits = torch.randn(8, 300, generator=torch.Generator().manual_seed(3))
    params = [
        SamplingParams(temperature=0.0 if i % 2 else 1.0, top_k=5 * (i % 3), seed=i)
        for i in range(7)
    ] + [SamplingParams(temperature=SAMPLING_EPS / 2)]  # below the epsilon: greedy
    tokens = Sampler(race=race).sample(logits, [f"r{i}" for i in range(8)], params)
    argmax = torch.argmax(logits, dim=-1).tolist()
    greedy = [i for i, p in enumerate(params) if p.temperature < SAMPLING_EPS]
    assert greedy == [1, 3, 5, 7]
    assert [tokens[i] for i in greedy] == [argmax[i] for i in greedy]
    assert (
        Sampler(race=race).sample(logits, [f"r{i}" for i in range(8)], [SamplingParams()] * 8)
        == argmax
    )


def test_two_level_race_follows_the_weights_across_blocks():
    """Weight only at 5 (block 0), 1030 (block 1) and 2400 (the partial block 2), 1 : 2 : 1:
    the race picks them at those frequencies and never a token of zero weight."""
    from rimuru.dataplane.engine.forward.sampling import RACE_BLOCK, num_race_draws, two_level_race

    assert RACE_BLOCK < 1030 < 2 * RACE_BLOCK < 2400 < 2500
    n = 8000  # standard error of each frequency <= 0.0056
    weights = torch.zeros(n, 2500)
    weights[:, [5, 1030, 2400]] = torch.tensor([1.0, 2.0, 1.0])
    generator = torch.Generator().manual_seed(0)
    uniform = torch.empty(n, num_race_draws(2500)).uniform_(1e-30, 1.0, generator=generator)
    picks = two_level_race(weights, uniform)
    counts = torch.bincount(picks, minlength=2500)
    assert counts.sum() == counts[[5, 1030, 2400]].sum() == n
    assert torch.allclose(counts[[5, 1030, 2400]] / n, torch.tensor([0.25, 0.5, 0.25]), atol=0.03)


def test_base_2_scores_keep_the_same_support_given_their_unit():
    from rimuru.dataplane.engine.forward.sampling import LN2, LOG2E

    natural = torch.randn(6, 300, generator=torch.Generator().manual_seed(3)) * 2
    params = [
        SamplingParams(temperature=1.0, top_p=0.8),
        SamplingParams(temperature=1.0, top_k=5),
        SamplingParams(temperature=1.0, top_k=40, top_p=0.6),
        SamplingParams(temperature=1.0, top_p=0.3),
        SamplingParams(temperature=1.0, top_k=1),
        SamplingParams(temperature=1.0, top_p=0.95),
    ]
    want = limit_support(natural, params).isfinite()
    got = limit_support(natural * LOG2E, params, unit=LN2).isfinite()
    assert torch.equal(got, want)
    # without the unit, top-p reads base-2 scores as natural ones, too peaked: fewer kept
    assert limit_support(natural * LOG2E, params).isfinite().sum() < want.sum()
