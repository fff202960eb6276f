"""Fixtures for the benchmark tests: bench/ scripts imported by path, synthetic results."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    # Registered first: dataclasses resolve string annotations through sys.modules.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def derive() -> ModuleType:
    return _load("derive_sharegpt_trace")


@pytest.fixture(scope="session")
def experiments() -> ModuleType:
    return _load("paper_experiments")


@pytest.fixture
def make_result():
    """Factory of a synthetic BenchResult: a pool of 8 GiB whose expert share shrinks as KV
    grows (unless `elastic` is False), with requests that arrive at `rate`."""
    from rimuru.dataplane.bench.metrics import RequestRecord, StepRecord
    from rimuru.dataplane.bench.results import BenchResult

    gib = 1 << 30

    def build(policy: str, rate: float, num_steps: int = 120, elastic: bool = True):
        steps = []
        for i in range(num_steps):
            running = min(i, num_steps - i, 40)
            kv = running * gib // 20
            expert = 6 * gib - (kv // 2 if elastic else 0)
            kv = min(kv, 8 * gib - expert)
            steps.append(
                StepRecord(
                    i,
                    0.05 * i,
                    running,
                    max(0, 30 - i),
                    kv // 4096,
                    expert // 4096,
                    kv,
                    expert,
                    8 * gib - kv - expert,
                    expert // (3 * 4096 * 64),
                    i % 3,
                    i % 2,
                    (i % 2) * 3 * 4096 * 64,
                    5,
                    8,
                    int(i == 7),
                )
            )
        requests = [
            RequestRecord.from_token_times(
                f"r{j}", j / rate, 16 + j, [j / rate + 0.2 + 0.03 * k for k in range(2 + j % 5)]
            )
            for j in range(20)
        ]
        config = {"budget_bytes": 8 * gib, "request_rate": rate, "policy": policy}
        duration = max(r.last_token_time for r in requests) + 0.1
        return BenchResult.build(policy, rate, config, requests, steps, duration)

    return build
