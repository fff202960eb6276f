"""bench/step_profile.py: the device-busy arithmetic, and a CPU run of the whole script so the
profile the next device session needs does not rot."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "step_profile.py"
sys.path.insert(0, str(SCRIPT.parent))
from step_profile import busy_ms  # noqa: E402


def test_busy_time_counts_overlapping_intervals_once():
    # µs: [0, 10) and [5, 20) overlap, [30, 35) stands alone, [31, 33) lies inside it
    assert busy_ms([(30, 35), (0, 10), (5, 20), (31, 33)]) == 25 / 1e3
    assert busy_ms([]) == 0.0


def test_cpu_profile_reports_every_step_of_a_steady_batch(tmp_path):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--model", "tiny", "--device", "cpu", "--batch", "3",
         "--steps", "8", "--prompt-len", "24", "--trace", "sharegpt_qwen_cpu",
         "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((tmp_path / "step_profile.json").read_text())
    assert (report["steps"], report["batch"], report["layers"]) == (8, 3, 4)
    assert len(report["wall_ms_each"]) == 8 and report["device_busy_ms"] is None
    # every measured step, plain and profiled, decodes the whole batch (16 steps: requests
    # sized for one phase alone would finish in the second)
    assert report["decoding_each"] == [3] * 16
    assert report["layer_ops"] == "TorchOps"  # the CPU path, fused kernels or not
    # four layers of Q/K/V/O, router, expert and head matmuls: aten::mm must show up, per step
    ops = {op["name"]: op for op in report["top_host_ops"]}
    assert "aten::mm" in ops and ops["aten::mm"]["calls_per_step"] >= 4 * 4
    assert "batch 3: wall" in done.stdout


def test_mixed_steps_take_one_prompt_each(tmp_path):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--model", "tiny", "--device", "cpu", "--batch", "2",
         "--steps", "2", "--prompt-len", "24", "--prefill-tokens", "20",
         "--trace", "sharegpt_qwen_cpu", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((tmp_path / "step_profile_prefill20.json").read_text())
    assert report["prefill_tokens"] == 20 and len(report["wall_ms_plain_each"]) == 2
    # the batch decodes throughout, and each joined prompt decodes from the step after it
    assert report["decoding_each"] == [2, 3, 4, 5]
    assert "+1 prompt of 20 per step" in done.stdout


def test_bad_batch_is_refused_with_a_message():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--batch", "0"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2 and "--batch" in done.stderr
