"""bench/gpu_checks.py runs its CPU-capable check under the Triton interpreter, so the script
a GPU run starts with does not rot; CUDA-only checks are skipped on the CPU."""

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu_checks.py"


def test_one_block_check_passes_on_the_cpu_and_cuda_checks_are_skipped(tmp_path):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--only", "one-block,sync",
         "--out", str(tmp_path)],
        env=dict(os.environ, TRITON_INTERPRET="1"), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads((tmp_path / "gpu_checks.json").read_text())
    assert [(name, result) for name, result, _ in rows] == [("one-block requests", "ok")]


def test_unknown_check_is_refused():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--only", "speed"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2 and "unknown checks ['speed']" in done.stderr
