"""bench/device_plan.py: each step stops at its own limit, a failed step does not stop the
next, results land in the job's folder, and every named plan fits one device call."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import device_plan
from device_plan import PLANS, Job, Step, plan_seconds

CALL_LIMIT_S = 600  # the device tool's longest command


def test_steps_keep_going_after_a_timeout_and_a_failure(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(
        PLANS,
        "test",
        (
            Job("a", 0, (Step("sleep 5", 1), Step("exit 3", 5), Step("echo $CUDA_VISIBLE_DEVICES > $JOB_OUT/gpu", 5))),
            Job("b", 1, (Step("echo hello", 5),)),
        ),
    )  # fmt: skip
    assert device_plan.main(["test", "--out", str(tmp_path)]) == 1
    rows = json.loads((tmp_path / "plan.json").read_text())
    assert [(r["job"], r["exit"]) for r in rows] == [("a", "timeout"), ("a", 3), ("a", 0), ("b", 0)]
    assert rows[0]["seconds"] < 4  # stopped at its 1 s limit, not after 5 s
    assert (tmp_path / "a" / "gpu").read_text().strip() == "0"
    assert "hello" in (tmp_path / "b.log").read_text()
    assert capsys.readouterr().out.splitlines()[-1].startswith("b")  # the table comes last


def test_a_failed_gate_skips_the_rest_of_its_job_only(tmp_path, monkeypatch):
    monkeypatch.setitem(
        PLANS,
        "test",
        (
            Job("a", 0, (Step("exit 1", 5, gate=True), Step("touch $JOB_OUT/ran", 5))),
            Job("b", 1, (Step("true", 5, gate=True), Step("touch $JOB_OUT/ran", 5))),
        ),
    )  # fmt: skip
    assert device_plan.main(["test", "--out", str(tmp_path)]) == 1
    rows = json.loads((tmp_path / "plan.json").read_text())
    assert [(r["job"], r["exit"]) for r in rows] == [("a", 1), ("a", "skipped"), ("b", 0), ("b", 0)]
    assert not (tmp_path / "a" / "ran").exists() and (tmp_path / "b" / "ran").exists()


def test_every_plan_fits_one_device_call_and_dry_run_runs_nothing(tmp_path, capsys):
    for name, jobs in PLANS.items():
        assert plan_seconds(jobs) <= CALL_LIMIT_S - 60, name  # room for the install and tar
        assert len({j.gpu for j in jobs}) == len(jobs), name  # one job per GPU
        assert device_plan.main([name, "--out", str(tmp_path / name), "--dry-run"]) == 0
    assert not list(tmp_path.iterdir())
    printed = capsys.readouterr().out
    assert "bench/gpu_checks.py --out $JOB_OUT" in printed
