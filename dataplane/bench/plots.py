"""PNG figures of benchmark results, in the style of the paper's Fig. 4 and Fig. 9.

Figures are drawn on matplotlib.figure.Figure objects and saved with the Agg renderer, never
through pyplot, so plotting changes no global backend state and needs no display.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure

from rimuru.dataplane.bench.goodput import evaluate
from rimuru.dataplane.bench.results import BenchResult
from rimuru.dataplane.bench.slo import SLO

GIB = float(1 << 30)
# Memory split colours: expert weights, KV cache, free pool pages.
_SPLIT_COLORS = ("#d62728", "#1f77b4", "#9ecae1", "#d9d9d9")
_LATENCY_STATS = ("mean", "median", "p99")


def plot_memory_split(
    results: Sequence[BenchResult],
    path: str | Path,
    dpi: int = 120,
    labels: Sequence[str] | None = None,
) -> Path:
    """Fig. 4: one panel per policy; x = forward step; stacked pool split (expert weights /
    KV / cached prefixes / free, GiB, left axis) and the number of running requests (right axis). `labels`
    names the panels (default: each run's policy)."""
    if not results:
        raise ValueError("plot_memory_split needs at least one result")
    if labels is not None and len(labels) != len(results):
        raise ValueError(f"{len(labels)} labels for {len(results)} results")
    for result in results:
        if not result.steps:
            raise ValueError(f"policy {result.policy!r} has no step records to plot")
    peak_gib = max(
        (s.kv_bytes + s.expert_bytes + s.cached_bytes + s.free_bytes) / GIB
        for r in results
        for s in r.steps
    )
    peak_running = max(r.step_metrics.peak_running for r in results)

    fig = Figure(figsize=(4.4 * len(results), 3.6), layout="constrained")
    axes = fig.subplots(1, len(results), sharey=True, squeeze=False)[0]
    for i, (ax, result) in enumerate(zip(axes, results, strict=True)):
        x = [s.step for s in result.steps]
        split = (
            [s.expert_bytes / GIB for s in result.steps],
            [s.kv_bytes / GIB for s in result.steps],
            [s.cached_bytes / GIB for s in result.steps],
            [s.free_bytes / GIB for s in result.steps],
        )
        names = ("expert weights", "KV cache", "cached prefixes", "free")
        ax.stackplot(x, *split, colors=_SPLIT_COLORS, labels=names)
        ax.set_ylim(0, peak_gib * 1.02)
        ax.set_xlim(x[0], x[-1] if len(x) > 1 else x[0] + 1)
        ax.set_xlabel("forward step")
        ax.set_title(
            f"{labels[i] if labels else result.policy}: "
            f"peak {result.step_metrics.peak_running} running, "
            f"{result.step_metrics.forward_steps} steps",
            fontsize=9,
        )
        twin = ax.twinx()
        twin.plot(x, [s.num_running for s in result.steps], color="black", lw=1, label="running")
        twin.set_ylim(0, max(peak_running, 1) * 1.05)
        if i == 0:
            ax.set_ylabel("pool memory (GiB)")
        if i == len(results) - 1:
            twin.set_ylabel("running requests")
        else:
            twin.tick_params(labelright=False)
    handles, labels = axes[0].get_legend_handles_labels()
    twin_handles, twin_labels = twin.get_legend_handles_labels()
    fig.legend(handles + twin_handles, labels + twin_labels, loc="outside lower center", ncols=4)
    return _save(fig, path, dpi)


def plot_rate_sweep(
    results: Sequence[BenchResult], path: str | Path, stat: str = "mean", dpi: int = 120
) -> Path:
    """Fig. 9: TTFT, TPOT (ms, `stat` = mean | median | p99) and output tokens/s against the
    request rate, one line per policy."""
    if stat not in _LATENCY_STATS:
        raise ValueError(f"stat must be one of {', '.join(_LATENCY_STATS)}, got {stat!r}")
    if not results:
        raise ValueError("plot_rate_sweep needs at least one result")
    if any(not math.isfinite(r.request_rate) for r in results):
        raise ValueError("a rate sweep plots finite request rates; leave out runs at rate inf")
    by_policy = _by_policy(results)
    panels = (
        (f"{stat} TTFT (ms)", lambda r: getattr(r.request_metrics.ttft, f"{stat}_ms")),
        (f"{stat} TPOT (ms)", lambda r: getattr(r.request_metrics.tpot, f"{stat}_ms")),
        ("output throughput (tok/s)", lambda r: r.request_metrics.output_throughput),
    )
    fig = Figure(figsize=(12.0, 3.4), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (label, value) in zip(axes, panels, strict=True):
        for policy, runs in by_policy.items():
            runs = sorted(runs, key=lambda r: r.request_rate)
            ax.plot([r.request_rate for r in runs], [value(r) for r in runs], "o-", label=policy)
        # From 0, so that a flat line reads as flat rather than as noise magnified.
        ax.set_ylim(0, max(max(value(r) for r in results) * 1.1, 1e-9))
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend()
    return _save(fig, path, dpi)


def plot_rate_search(
    results: Sequence[BenchResult], slo: SLO, path: str | Path, dpi: int = 120
) -> Path:
    """The rate search against an SLO: output tokens/s, then each SLO'd latency percentile
    (ms), against the request rate; one line per policy, each limit a dashed line."""
    if not results:
        raise ValueError("plot_rate_search needs at least one result")
    by_policy = _by_policy(results)
    fig = Figure(figsize=(4.0 * (1 + len(slo.limits)), 3.4), layout="constrained")
    axes = fig.subplots(1, 1 + len(slo.limits), squeeze=False)[0]
    for policy, runs in by_policy.items():
        runs = sorted(runs, key=lambda r: r.request_rate)
        rates = [r.request_rate for r in runs]
        axes[0].plot(rates, [r.request_metrics.output_throughput for r in runs], "o-", label=policy)
        reports = [evaluate(slo, r) for r in runs]
        for ax, limit in zip(axes[1:], slo.limits, strict=True):
            ax.plot(rates, [x.percentiles_ms[limit.name] for x in reports], "o-", label=policy)
    axes[0].set_ylabel("output throughput (tok/s)")
    for ax, limit in zip(axes[1:], slo.limits, strict=True):
        ax.axhline(limit.limit_ms, color="black", ls="--", lw=1, label=f"SLO {limit}")
        ax.set_ylabel(f"{limit.metric.upper()} p{limit.percentile} (ms)")
        ax.legend(fontsize=8)
    for ax in axes:
        ax.set_ylim(bottom=0)
        ax.set_xlabel("request rate (req/s)")
        ax.grid(alpha=0.3)
    axes[0].legend()
    return _save(fig, path, dpi)


def _by_policy(results: Sequence[BenchResult]) -> dict[str, list[BenchResult]]:
    by_policy: dict[str, list[BenchResult]] = defaultdict(list)
    for result in results:
        by_policy[result.policy].append(result)
    return by_policy


def _save(fig: Figure, path: str | Path, dpi: int) -> Path:
    path = Path(path)
    if path.suffix.lower() != ".png":
        raise ValueError(f"plots are written as PNG; give a path ending in .png, not {path}")
    fig.savefig(path, dpi=dpi, format="png")
    return path
