"""Timing two variants of one op against each other in interleaved rounds.

Why: kernels_gpu.py used to take two `do_bench` medians per variant, one after the other.
Between two such medians of the *same* launcher the H200 moved by up to 18% (clock, L2 and
power state drift over seconds), far above the +0.5% paged-overhead target. Here the two
variants alternate in short rounds (A B, then B A, ...), so drift hits both alike, and the
overhead is the median of the per-round ratios, with its interquartile range as the spread.

    samples = interleaved_samples(paged.replay, contig.replay, rounds=12, reps=25)
    ab = summarize_ab(*samples)      # ab.ratio - 1 is the paged overhead

`summarize_ab` is plain arithmetic (tested on the CPU); `interleaved_samples` needs CUDA.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch

Rounds = list[list[float]]  # per round, the seconds of each repetition


@dataclass(frozen=True)
class ABResult:
    a_s: float  # median of every A repetition
    b_s: float
    ratio: float  # median over rounds of (median A / median B) in that round
    ratio_q1: float  # interquartile range of the per-round ratios
    ratio_q3: float
    rounds: int


def _quartiles(values: list[float]) -> tuple[float, float]:
    if len(values) == 1:
        return values[0], values[0]
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q3


def summarize_ab(a: Rounds, b: Rounds) -> ABResult:
    if len(a) != len(b) or not a or any(not r for r in a + b):
        raise ValueError("need the same number of non-empty rounds for A and B")
    ratios = [statistics.median(ra) / statistics.median(rb) for ra, rb in zip(a, b, strict=True)]
    q1, q3 = _quartiles(ratios)
    return ABResult(
        a_s=statistics.median([t for r in a for t in r]),
        b_s=statistics.median([t for r in b for t in r]),
        ratio=statistics.median(ratios),
        ratio_q1=q1,
        ratio_q3=q3,
        rounds=len(a),
    )


def flushed_calls(reps: int) -> Callable[[Callable[[], None]], list[float]]:
    """A timer: it runs fn `reps` times, each after an L2 flush, and returns the seconds of
    each call (CUDA events around the call alone)."""
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")  # > the H200's 50 MB L2
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(reps)]  # fmt: skip

    def one_round(fn: Callable[[], None]) -> list[float]:
        for start, end in events:
            flush.zero_()
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        return [1e-3 * start.elapsed_time(end) for start, end in events]

    return one_round


def interleaved_samples(
    run_a: Callable[[], None], run_b: Callable[[], None], *, rounds: int, reps: int
) -> tuple[Rounds, Rounds]:
    """Seconds per call of run_a and run_b, L2 flushed before each, in alternating rounds."""
    one_round = flushed_calls(reps)

    for _ in range(3):  # warm-up: clocks up, code paths loaded
        run_a(), run_b()
    a: Rounds = []
    b: Rounds = []
    for r in range(rounds):
        if r % 2 == 0:
            a.append(one_round(run_a))
            b.append(one_round(run_b))
        else:
            b.append(one_round(run_b))
            a.append(one_round(run_a))
    return a, b
