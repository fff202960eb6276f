"""Fixtures and timers shared by the fused MoE's tuner and kernel table (bench/tune_moe.py,
bench/kernels_gpu.py): model shapes, experts laid out on shuffled pool pages and
loading-buffer slots, random routing, CUDA-graph timing, and A/B timing in interleaved rounds.

Imports only torch (and triton inside the CUDA timers), like every module here; nothing in the
engine imports it.

Why interleaved A/B rounds: two `do_bench` medians of the *same* launcher taken one after the
other moved by up to a fifth on a GPU (clock, L2 and power state drift over seconds), far above
a +0.5% paged-overhead target. The two variants alternate in short rounds (A B, then B A,
...), so drift hits both alike, and the overhead is the median of the per-round ratios, with
its interquartile range as the spread:

    samples = interleaved_samples(paged.replay, contig.replay, rounds=12, reps=25)
    ab = summarize_ab(*samples)      # ab.ratio - 1 is the paged overhead

`summarize_ab` and `model_names` are plain Python (tested on the CPU); the rest needs CUDA.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from rimuru.kernels.moe_gemm import WeightSource

# Shape key: E = experts, I = expert intermediate, D = hidden, K = top-k, T = tokens.


@dataclass(frozen=True)
class MoeShape:
    name: str
    num_experts: int
    inter_size: int
    hidden_size: int
    top_k: int


MODELS = {
    "qwen1.5-moe-a2.7b": MoeShape("Qwen1.5-MoE-A2.7B", 60, 1408, 2048, 4),
    "qwen3-30b-a3b": MoeShape("Qwen3-30B-A3B", 128, 768, 2048, 8),
    "mixtral-8x7b": MoeShape("Mixtral-8x7B", 8, 14336, 4096, 2),
}
TOKEN_COUNTS = [2**i for i in range(13)]  # 1 .. 4096


def model_names(arg: str) -> list[str]:
    """--models of the GPU scripts: a comma list of MODELS keys, or 'all'."""
    names = sorted(MODELS) if arg == "all" else arg.split(",")
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        raise ValueError(f"unknown models {unknown}; choose from {sorted(MODELS)}")
    return names


@dataclass(frozen=True)
class PagedExperts:
    """The experts of one layer three ways: stacks, contiguous twin and pages."""

    w1: torch.Tensor  # [E, I, D]
    w3: torch.Tensor  # [E, I, D]
    w2: torch.Tensor  # [E, D, I]
    w13: torch.Tensor  # [E, 2I, D]
    pool_pages: torch.Tensor  # [num_pages, I*D]
    buffer_pages: torch.Tensor  # [num_slots, I*D]
    expert_table: torch.Tensor  # [E, 3] int32

    def paged_source(self) -> WeightSource:
        return WeightSource(self.pool_pages, self.buffer_pages, True, self.pool_pages.stride(0), 0)


def make_experts(
    shape: MoeShape, dtype: torch.dtype, device: torch.device, seed: int, buffered_share=0.125
) -> PagedExperts:
    """Random experts; pages land in a shuffled pool with spare pages between them, and a
    share of the experts sits in loading-buffer slots instead."""
    E, inter, D = shape.num_experts, shape.inter_size, shape.hidden_size
    gen = torch.Generator(device=device).manual_seed(seed)
    w1 = (torch.randn(E, inter, D, generator=gen, device=device) * D**-0.5).to(dtype)
    w3 = (torch.randn(E, inter, D, generator=gen, device=device) * D**-0.5).to(dtype)
    w2 = (torch.randn(E, D, inter, generator=gen, device=device) * inter**-0.5).to(dtype)
    num_buffered = int(E * buffered_share)
    order = torch.randperm(E, generator=torch.Generator().manual_seed(seed)).tolist()
    buffered, pooled = order[:num_buffered], order[num_buffered:]
    num_pages = 3 * len(pooled) + max(4, len(pooled) // 2)
    page_ids = torch.randperm(num_pages, generator=torch.Generator().manual_seed(seed + 1))
    pool = torch.empty(num_pages, inter * D, dtype=dtype, device=device)
    buffer = torch.empty(max(1, 3 * num_buffered), inter * D, dtype=dtype, device=device)
    table = torch.full((E, 3), -(2**30), dtype=torch.int32)  # sentinel: must never be read
    for i, e in enumerate(pooled):
        for j, w in enumerate((w1[e], w3[e], w2[e])):
            pid = int(page_ids[3 * i + j])
            pool[pid].copy_(w.reshape(-1))
            table[e, j] = pid
    for i, e in enumerate(buffered):
        for j, w in enumerate((w1[e], w3[e], w2[e])):
            buffer[3 * i + j].copy_(w.reshape(-1))
            table[e, j] = -(3 * i + j) - 1
    w13 = torch.cat([w1, w3], dim=1)
    return PagedExperts(w1, w3, w2, w13, pool, buffer, table.to(device))


def random_routing(
    num_tokens: int, shape: MoeShape, device: torch.device, seed: int, skew: float = 0.0
):
    """Top-k of random router logits; ``skew`` > 0 tilts them as the presets' routers are
    tilted (a bias -skew * ln(1 + rank) over a seeded ranking of the experts), so a decode
    batch routes to fewer experts with more rows each."""
    gen = torch.Generator(device=device).manual_seed(seed)
    logits = torch.randn(num_tokens, shape.num_experts, generator=gen, device=device)
    if skew:
        rank = torch.randperm(shape.num_experts, generator=gen, device=device)
        logits = logits - skew * torch.log1p(rank.to(logits.dtype))
    weights, ids = torch.topk(logits.softmax(-1), shape.top_k, dim=-1)
    return ids.to(torch.int32), weights / weights.sum(-1, keepdim=True)


def graph_of(fn) -> torch.cuda.CUDAGraph:
    """fn captured in a CUDA graph after two warm-up calls on a side stream."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


# The H200's ceilings, measured there: bf16 dense matmul and a device copy (bytes read +
# written). A kernel's floor is max(FLOPs / PEAK_FLOPS, bytes / PEAK_BYTES).
PEAK_FLOPS = 755e12
PEAK_BYTES = 4.17e12


def replay_ms(fn, rep_ms: float) -> float:
    """Median of CUDA-graph replays of fn (L2 flushed before each): at small sizes a direct
    launch's host time would be timed too."""
    import triton.testing

    replay = graph_of(fn).replay
    return triton.testing.do_bench(
        replay, warmup=max(1, rep_ms // 4), rep=rep_ms, return_mode="median"
    )


def run_info() -> dict:
    """Date, command, device and versions: the header of every GPU report."""
    import triton

    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": " ".join(["python", *sys.argv]),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
    }


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
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")  # larger than any L2
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
