"""bench/tp_gpu.py (the multi-GPU runs) at a tiny size on the CPU with gloo, so the script
does not rot between multi-GPU runs."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "tp_gpu.py"
TINY = ["--device", "cpu", "--model", "tiny", "--tp", "2", "--num-prompts", "1",
        "--max-tokens", "4", "--memory-budget", "400MiB", "--trace", "sharegpt_qwen_cpu"]  # fmt: skip


def _run(run: str, out: Path) -> dict:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), run, *TINY, "--out", str(out)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((out / "tp_gpu.json").read_text())


def test_checks_find_tp2_tokens_equal_to_tp1s(tmp_path):
    rows = _run("checks", tmp_path)["rows"]
    assert [r["check"] for r in rows] == [
        f"{mode} {kind}" for mode in ("resident", "fixed", "elastic")
        for kind in ("greedy", "seeded")
    ]  # fmt: skip
    assert all(r["equal"] and r["matched"] == "4/4" for r in rows)


def test_throughput_runs_every_policy_at_tp1_and_tp2(tmp_path):
    rows = _run("throughput", tmp_path)["rows"]
    assert [(r["tp"], r["policy"]) for r in rows] == [
        (tp, mode) for tp in (1, 2) for mode in ("resident", "fixed", "elastic")
    ]
    assert all(r["output_tok_s"] > 0 for r in rows)
