"""Run a named plan of GPU jobs in one device call: one job per GPU, in parallel, each a list
of commands run in order under their own time limits, with logs and a summary table.

    # on the device (x2 kind; the tool returns at most 8 files, so pack the folder):
    python3 bench/device_plan.py next-session --out /tmp/r; tar czf $OUT/r.tgz -C /tmp r
    python bench/device_plan.py next-session --out /tmp/r --dry-run   # here: print what would run

Why: a device session has 30 minutes and each call costs a start. Written inline, a call's
shell line is easy to get wrong (2026-11-30 lost a Fig. 4 job to a missing flag), and one
job running over its time takes the others' results with it. Here every command is data,
checked by `--dry-run` and by a CPU test, and each stops at its own limit.

Each command's output goes to OUT/<job>.log; OUT/plan.json records exit codes and seconds;
result folders go under OUT/<job>/ (commands see it as $JOB_OUT). The table is printed last.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Step:
    command: str  # run by bash in the repository root; $JOB_OUT is the job's result folder
    limit_s: int
    # If this step fails, the job's later steps are skipped: a failed check means their
    # figures would not be today's engine (11-30 09:00: a graph plan 5x too large turned the
    # graphs off, and 400 s of runs after the failed check measured eager steps).
    gate: bool = False


@dataclass(frozen=True)
class Job:
    name: str
    gpu: int
    steps: tuple[Step, ...]


FIG4 = "python3 bench/engine_gpu.py --skip-a --expert-offload-limit 30 --num-prompts 500"
STEP = "python3 bench/step_profile.py --model qwen3-30b-a3b --memory-budget 59GiB --batch 32"
PLANS: dict[str, tuple[Job, ...]] = {
    # Plans that were run are pruned once recorded: docs/benchmarks.md gives each run's
    # command and commit, and `git show <commit>:bench/device_plan.py` its plan (11-30's
    # device-copy, rate-sweep-heavy, check-kernels, heavy-fused, heavy-512: commit a6ba2a8;
    # next-session, piecewise, piecewise-2, copy-sweep, limit10: commit a46513a; 11-30's
    # last next-session and next-session-2 (the ablation, fixed at skew 0): commit 1cfb719;
    # budget-cap (run at 08:59, 09:12, 09:15 and 09:18 UTC with its changes: the 09:18 run
    # at commit 8a2e179) and meter (09:30): commit 3de1433; tail-tiles (11:13): commit
    # cd3ddfe; occupancy (11:18): commit 490b485; next-session with the kernels after its
    # checks (11:20; the resident sweep ran past its 280 s): commit 87bcb49; huge-blocks
    # (11:31): commit 66ee080; next-session-2 (the ablation, fixed at skew 0; 11:35): commit
    # c77aee2; overload-pair (12:10): commit d494226; persistent (13:07 at 81eeb53, with
    # warp specialization; 13:20): commit 1442163; confirm (13:26): commit e6649bc; ws-probe
    # (13:31 at 9611648; 13:39): commit 798a617; gluon-probe (14:50): commit ec2ca72;
    # dense-check (14:54 at b685b50, 14:55 at 4b7de26, 14:57 at 03cbfaa, 15:00 at 7bb54a8),
    # group-m (15:01-15:06 at 4f59268), paged-probe (15:10 at 31931b3), decode-breakdown
    # (15:26 at 765526b), align-probe (15:31 at 3d82fa0, 15:34 at 2d5e7d7, 15:38 at
    # 4a46fea): commit 4a46fea).
    # Where a qwen3 step's time goes, and the kernels after any change to them.
    "profile": (
        Job("gpu0", 0, (
            Step(f"{STEP} --out $JOB_OUT", 300),
        )),
        Job("gpu1", 1, (
            Step("python3 bench/moe_breakdown.py --out $JOB_OUT", 240),
            Step("python3 bench/kernels_gpu.py --tokens 1,1024,2048,4096 --skip-attention "
                 "--out-dir $JOB_OUT", 240),
        )),
    ),
    # First call of the next session: the align paths' outputs checked on the GPU (the sort
    # rank has run there only untested) and timed, and the decode-size breakdown on today's
    # align default (cab7eb4, not yet measured); beside it the GPU checks and kernel table.
    "next-kernels": (
        Job("gpu0", 0, (
            Step("python3 bench/align_probe.py --out $JOB_OUT", 300),
            Step("python3 bench/moe_breakdown.py --tokens 1,16,64,256 --out $JOB_OUT", 200),
        )),
        Job("gpu1", 1, (
            Step("python3 bench/gpu_checks.py --out $JOB_OUT", 60, gate=True),
            Step("python3 bench/kernels_gpu.py --tokens 1,1024,2048,4096 --skip-attention "
                 "--out-dir $JOB_OUT", 150),
        )),
    ),
    # Experiment 2 at overload with both policies in one call (for issue 5's record). Resident's KV is 3.3x smaller than at 11-30 06:55 since the graph plan prices the
    # driver's memory, and it did not finish 1,000 requests in 280 s (11:20) nor 500 in 250 s
    # (12:10, where elastic served them in 60 s): 500 requests, and all the time a call has.
    "next-session": (
        Job("gpu0", 0, (
            Step("python3 bench/gpu_checks.py --out $JOB_OUT", 60, gate=True),
            Step("python3 bench/paper_experiments.py rate-sweep --policy elastic --rates 16 "
                 "--num-prompts 500 --max-num-seqs 512 --out $JOB_OUT/elastic512_500", 300),
        )),
        Job("gpu1", 1, (
            Step("python3 bench/paper_experiments.py rate-sweep --policy resident --rates 16 "
                 "--num-prompts 500 --max-num-seqs 512 --out $JOB_OUT/resident512_500", 530),
        )),
    ),
}  # fmt: skip


def run_job(job: Job, out: Path) -> list[dict]:
    """The job's steps in order, each under its limit; a failed step does not stop the next
    unless it is a gate."""
    folder = out / job.name
    folder.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(job.gpu), JOB_OUT=str(folder))
    env.setdefault("PYTHONUNBUFFERED", "1")
    rows = []
    closed = False  # a gate step failed
    with open(out / f"{job.name}.log", "a") as log:
        for step in job.steps:
            if closed:
                rows.append({"job": job.name, "command": step.command, "exit": "skipped",
                             "seconds": 0.0, "limit_s": step.limit_s})  # fmt: skip
                continue
            log.write(f"\n$ {step.command}\n")
            log.flush()
            t0 = time.time()
            try:
                code = subprocess.run(
                    ["bash", "-c", step.command], env=env, stdout=log, stderr=subprocess.STDOUT,
                    timeout=step.limit_s,
                ).returncode  # fmt: skip
            except subprocess.TimeoutExpired:
                code = "timeout"
            rows.append(
                {"job": job.name, "command": step.command, "exit": code,
                 "seconds": round(time.time() - t0, 1), "limit_s": step.limit_s}
            )  # fmt: skip
            closed = step.gate and code != 0
    return rows


def plan_seconds(jobs: tuple[Job, ...]) -> int:
    """The plan's worst case: its longest job with every step at its limit."""
    return max(sum(s.limit_s for s in job.steps) for job in jobs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plan", choices=sorted(PLANS))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = ap.parse_args(argv)
    jobs = PLANS[args.plan]
    if args.dry_run:
        for job in jobs:
            for step in job.steps:
                print(f"[{job.name} GPU {job.gpu}, {step.limit_s} s] {step.command}")
        print(f"worst case {plan_seconds(jobs)} s (a device call may run 600 s)")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(len(jobs)) as pool:
        rows = [r for job_rows in pool.map(lambda j: run_job(j, args.out), jobs) for r in job_rows]
    (args.out / "plan.json").write_text(json.dumps(rows, indent=1) + "\n")
    print(f"{'job':6s} {'exit':>7s} {'s':>7s}  command")
    for r in rows:
        print(f"{r['job']:6s} {r['exit']!s:>7s} {r['seconds']:7.1f}  {r['command'][:90]}")
    return 0 if all(r["exit"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
