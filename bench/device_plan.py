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
    # device-copy, rate-sweep-heavy, check-kernels, heavy-fused, heavy-512: commit a6ba2a8).
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
    # Piecewise CUDA graphs (new): the checks that cover them, a mixed qwen3 step (32
    # decodes + one 512-token prompt) with and without them, Exp. 2 and Fig. 4 resident.
    "piecewise": (
        Job("gpu0", 0, (
            Step("python3 bench/gpu_checks.py --only sync,compile,graphs,device-copy "
                 "--out $JOB_OUT", 150),
            Step(f"{STEP} --prefill-tokens 512 --steps 8 --out $JOB_OUT", 170),
            Step(f"{STEP} --prefill-tokens 512 --steps 8 --cudagraph-mode full_decode_only "
                 "--out $JOB_OUT", 170),
        )),
        Job("gpu1", 1, (
            Step("python3 bench/paper_experiments.py rate-sweep --policy resident --rates 16 "
                 "--num-prompts 1000 --max-num-seqs 512 --out $JOB_OUT/resident512", 330),
            Step(f"{FIG4} --policies resident --out $JOB_OUT/fig4_resident", 180),
        )),
    ),
    # Its second: Exp. 2 elastic at max_num_seqs 512, Fig. 4 elastic and fixed, layer ops.
    "piecewise-2": (
        Job("gpu0", 0, (
            Step("python3 bench/paper_experiments.py rate-sweep --policy elastic --rates 16 "
                 "--num-prompts 1000 --max-num-seqs 512 --out $JOB_OUT/elastic512", 330),
            # the layer ops' bf16 error against fp32 (new), beside torch's
            Step("python3 bench/kernels_gpu.py --tokens 1 --skip-attention --out-dir $JOB_OUT",
                 90),
        )),
        Job("gpu1", 1, (
            Step(f"{FIG4} --policies elastic --out $JOB_OUT/fig4_elastic", 180),
            Step(f"{FIG4} --policies fixed --fixed-expert-share 0.75 --out $JOB_OUT/fig4_fixed",
                 240),
        )),
    ),
    # The copy-in kernel's PCIe bandwidth against the copy engines (never measured), Fig. 4
    # with skew 0 on today's defaults, and Exp. 4's burst sweep (capacity at t = 0).
    "copy-sweep": (
        Job("gpu0", 0, (
            Step("python3 bench/expert_copy_gpu.py --out $JOB_OUT", 150),
            Step(f"{FIG4} --router-skew 0 --policies resident,elastic --out $JOB_OUT/fig4_skew0",
                 330),
        )),
        Job("gpu1", 1, (
            Step("python3 bench/paper_experiments.py offload-sweep --limits 0,10,30,5,15 "
                 "--num-prompts 200 --out $JOB_OUT/offload", 500),
        )),
    ),
    # Fig. 4's elastic at offload limit 10 (Exp. 4's knee) with skew 0 and 1: at skew 0 the
    # limit-30 elastic copied 5.4 TB and ran at half resident's rate (07:08).
    "limit10": (
        Job("gpu0", 0, (
            Step("python3 bench/engine_gpu.py --skip-a --expert-offload-limit 10 --num-prompts 500 "
                 "--router-skew 0 --policies elastic --out $JOB_OUT/skew0", 240),
        )),
        Job("gpu1", 1, (
            Step("python3 bench/engine_gpu.py --skip-a --expert-offload-limit 10 --num-prompts 500 "
                 "--policies elastic --out $JOB_OUT/skew1", 240),
        )),
    ),
    # The next session's first call: the fused norms/RoPE against torch in bf16 (kernels_gpu's
    # layer-ops section; never compared yet), every check on today's defaults, and the
    # light-load TPOT goal with device copy-in and fused ops (last measured before both).
    "next-session": (
        Job("gpu0", 0, (
            Step("python3 bench/kernels_gpu.py --tokens 1,1024,4096 --skip-attention "
                 "--out-dir $JOB_OUT", 120),
            Step("python3 bench/gpu_checks.py --out $JOB_OUT", 120),
            Step("python3 bench/paper_experiments.py rate-sweep --policy resident --rates 1 "
                 "--num-prompts 100 --out $JOB_OUT/resident_light", 260),
        )),
        Job("gpu1", 1, (
            Step("python3 bench/paper_experiments.py rate-sweep --policy elastic --rates 1 "
                 "--num-prompts 100 --out $JOB_OUT/elastic_light", 260),
        )),
    ),
    # Its second call: Experiment 2 at overload with max_num_seqs 512 for both policies on
    # one host (11-30 compared elastic at 512 on one machine with resident at 256 on another).
    "next-session-2": (
        Job("gpu0", 0, (
            Step("python3 bench/paper_experiments.py rate-sweep --policy resident --rates 16 "
                 "--num-prompts 1000 --max-num-seqs 512 --out $JOB_OUT/resident512", 330),
        )),
        Job("gpu1", 1, (
            Step("python3 bench/paper_experiments.py rate-sweep --policy elastic --rates 16 "
                 "--num-prompts 1000 --max-num-seqs 512 --out $JOB_OUT/elastic512", 330),
        )),
    ),
}  # fmt: skip


def run_job(job: Job, out: Path) -> list[dict]:
    """The job's steps in order, each under its limit; a failed step does not stop the next."""
    folder = out / job.name
    folder.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(job.gpu), JOB_OUT=str(folder))
    env.setdefault("PYTHONUNBUFFERED", "1")
    rows = []
    with open(out / f"{job.name}.log", "a") as log:
        for step in job.steps:
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
