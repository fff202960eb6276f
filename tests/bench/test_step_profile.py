"""bench/step_profile.py: the device-busy arithmetic, and a CPU run of the whole script so the
GPU profile does not rot."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "step_profile.py"
sys.path.insert(0, str(SCRIPT.parent))
from step_profile import busy_ms  # noqa: E402

from rimuru.dataplane.bench.trace import load_trace  # noqa: E402


def test_busy_time_counts_overlapping_intervals_once():
    # µs: [0, 10) and [5, 20) overlap, [30, 35) stands alone, [31, 33) lies inside it
    assert busy_ms([(30, 35), (0, 10), (5, 20), (31, 33)]) == 25 / 1e3
    assert busy_ms([]) == 0.0


def profile_tiny(out: Path, *flags: str) -> subprocess.CompletedProcess:
    """The script on the CPU: `tiny`, prompts cut to 24 tokens of the bundled trace."""
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--model", "tiny", "--device", "cpu", "--prompt-len", "24",
         "--trace", "sharegpt_qwen_cpu", "--out", str(out), *flags],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def test_cpu_profile_reports_every_step_of_a_steady_batch(tmp_path):
    done = profile_tiny(tmp_path, "--batch", "3", "--steps", "8")
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
    assert "tiny (4 layers), resident, eager" in done.stdout
    assert done.stdout.splitlines()[-1].split()[0] == "3"  # the table's one row: batch 3


def test_mixed_steps_take_one_prompt_each(tmp_path):
    done = profile_tiny(tmp_path, "--batch", "2", "--steps", "2", "--prefill-tokens", "20")
    report = json.loads((tmp_path / "step_profile_prefill20.json").read_text())
    assert report["prefill_tokens"] == 20 and len(report["wall_ms_plain_each"]) == 2
    # the batch decodes throughout, and each joined prompt decodes from the step after it
    assert report["decoding_each"] == [2, 3, 4, 5]
    assert "+1 prompt of 20 per step" in done.stdout


def test_a_batch_sweep_reports_each_batch_with_its_roofline(tmp_path):
    done = profile_tiny(tmp_path, "--batch", "1,4", "--steps", "2")
    # tiny: 4 layers of 32 experts (top 4), D 128, I 128, 2 KV heads of 32, fp32 weights
    per_expert, kv_per_token = 3 * 128 * 128 * 4, 2 * 2 * 32 * 4
    for batch in (1, 4):
        report = json.loads((tmp_path / f"step_profile_b{batch}.json").read_text())
        assert report["batch"] == batch and report["decoding_each"] == [batch] * 4
        roof = report["roofline"]
        assert roof["decoding"] == batch
        # each decoding token routes to top-4 of 32 experts in each of 4 layers
        assert 4 * 4 <= roof["distinct_experts"] <= min(4 * 32, 4 * 4 * batch)
        assert roof["expert_bytes"] == roof["distinct_experts"] * per_expert
        # each prompt (cut to 24 tokens) and its 5 outputs: the prefill's, 4 measured steps'
        prompts = load_trace("sharegpt_qwen_cpu").requests[:batch]
        context = sum(min(len(r.prompt_token_ids), 24) + 5 for r in prompts)
        assert roof["kv_bytes"] == context * 4 * kv_per_token
        assert roof["ms"] == roof["total_bytes"] / 4.17e12 * 1e3
    rows = [line.split() for line in done.stdout.splitlines()[-2:]]
    assert [row[0] for row in rows] == ["1", "4"]


def test_bad_batch_is_refused_with_a_message():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--batch", "0"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2 and "--batch" in done.stderr
