"""A benchmark run's result (one policy over one request stream) and its JSON file format.

A results file holds several runs, e.g. the three policies on one trace, or a rate sweep:

    {"format": "rimuru-bench-results/1", "results": [BenchResult.to_dict(), ...],
     "slo": {...}}

The `slo` section is optional (written by `rimuru bench --slo`: dataplane/bench/goodput.py's
`slo_section`); readers of the results alone ignore it, so files with and without it share
the format's version.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any

from rimuru.dataplane.bench.metrics import (
    LatencyStats,
    RequestMetrics,
    RequestRecord,
    StepMetrics,
    StepRecord,
    summarize_requests,
    summarize_steps,
)

_REQUEST_COLUMNS = (
    "request_id",
    "arrival_time",
    "first_token_time",
    "last_token_time",
    "prompt_len",
    "output_len",
)
_STEP_COLUMNS = tuple(f.name for f in fields(StepRecord))
RESULTS_FORMAT = "rimuru-bench-results/1"


@dataclass(frozen=True)
class BenchResult:
    """One policy's run over one request stream: the records and their summaries.

    In JSON, requests and steps are stored column by column; requests lose their
    token_times (ITL stays in request_metrics), so reading a file back does not recompute
    the summaries but restores them as written. `config` must be JSON-compatible; non-finite
    floats in it (e.g. a rate of inf) are written as the strings "inf", "-inf", "nan".
    """

    policy: str
    request_rate: float
    config: Mapping[str, Any]
    requests: tuple[RequestRecord, ...]
    steps: tuple[StepRecord, ...]
    request_metrics: RequestMetrics
    step_metrics: StepMetrics

    def __post_init__(self) -> None:
        object.__setattr__(self, "config", MappingProxyType(dict(self.config)))
        object.__setattr__(self, "requests", tuple(self.requests))
        object.__setattr__(self, "steps", tuple(self.steps))

    @classmethod
    def build(
        cls,
        policy: str,
        request_rate: float,
        config: Mapping[str, Any],
        requests: Sequence[RequestRecord],
        steps: Sequence[StepRecord],
        duration_s: float,
    ) -> BenchResult:
        return cls(
            policy,
            request_rate,
            config,
            tuple(requests),
            tuple(steps),
            summarize_requests(requests, duration_s),
            summarize_steps(steps),
        )

    def headline(self) -> dict[str, Any]:
        """The figures of the benchmark's summary table, flat."""
        r, s = self.request_metrics, self.step_metrics
        return {
            "policy": self.policy,
            "request_rate": self.request_rate,
            "completed": r.num_completed,
            "peak_running": s.peak_running,
            "mean_running": s.mean_running,
            "forward_steps": s.forward_steps,
            "output_tok_s": r.output_throughput,
            "ttft_p50_ms": r.ttft.median_ms,
            "ttft_p99_ms": r.ttft.p99_ms,
            "tpot_p50_ms": r.tpot.median_ms,
            "tpot_p99_ms": r.tpot.p99_ms,
            "preemptions": s.total_preemptions,
            "evictions": s.total_evictions,
            "loads": s.total_loads,
            "predictor_hit_rate": s.predictor_hit_rate,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "request_rate": _finite_or_str(self.request_rate),
            "config": _finite_or_str(dict(self.config)),
            "requests": {
                c: [_plain(getattr(r, c)) for r in self.requests] for c in _REQUEST_COLUMNS
            },
            "steps": {c: [_plain(getattr(s, c)) for s in self.steps] for c in _STEP_COLUMNS},
            "request_metrics": asdict(self.request_metrics),
            "step_metrics": asdict(self.step_metrics),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BenchResult:
        requests = [RequestRecord(*row) for row in _rows(data["requests"], _REQUEST_COLUMNS)]
        steps = [StepRecord(*row) for row in _rows(data["steps"], _STEP_COLUMNS)]
        metrics = {
            k: LatencyStats(**v) if isinstance(v, dict) else v
            for k, v in data["request_metrics"].items()
        }
        return cls(
            data["policy"],
            float(data["request_rate"]),
            data["config"],
            tuple(requests),
            tuple(steps),
            RequestMetrics(**metrics),
            StepMetrics(**data["step_metrics"]),
        )


def write_results(
    path: str | Path, results: Sequence[BenchResult], slo: Mapping[str, Any] | None = None
) -> Path:
    path = Path(path)
    document: dict[str, Any] = {"format": RESULTS_FORMAT, "results": [r.to_dict() for r in results]}
    if slo is not None:
        document["slo"] = _finite_or_str(dict(slo))
    path.write_text(json.dumps(document, indent=1, allow_nan=False) + "\n")
    return path


def read_results(path: str | Path) -> list[BenchResult]:
    return [BenchResult.from_dict(r) for r in _read_document(path)["results"]]


def read_slo_section(path: str | Path) -> dict[str, Any] | None:
    """The file's `slo` section as written, or None for a run without --slo."""
    return _read_document(path).get("slo")


def _read_document(path: str | Path) -> dict[str, Any]:
    document = json.loads(Path(path).read_text())
    if not isinstance(document, dict) or document.get("format") != RESULTS_FORMAT:
        raise ValueError(f"{path} is not a {RESULTS_FORMAT} file (written by write_results)")
    return document


def _rows(columns: Mapping[str, list], names: Sequence[str]) -> list[tuple]:
    """Rows of the named columns; a column that files written before it existed lack takes
    its field's default (StepRecord.cached_bytes)."""
    length = len(next(iter(columns.values()), []))
    defaults = {f.name: f.default for f in fields(StepRecord) if f.default is not MISSING}
    return list(
        zip(*(columns[n] if n in columns else [defaults[n]] * length for n in names), strict=True)
    )


def _plain(value: Any) -> Any:
    """numpy / torch scalars (which engines hand over) as the Python numbers JSON takes."""
    return value.item() if hasattr(value, "item") and not isinstance(value, str) else value


def _finite_or_str(value: Any) -> Any:
    value = _plain(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite_or_str(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_or_str(v) for v in value]
    return value


def output_dir(path: str | Path) -> Path:
    """--output-dir, made if absent; a file at that path is refused by name (mkdir would say
    only "File exists")."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--output-dir {out} is a file: give a directory (made if absent)")
    out.mkdir(parents=True, exist_ok=True)
    return out
