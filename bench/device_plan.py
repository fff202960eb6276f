"""Run a named plan of GPU jobs in one device call: one job per GPU, in parallel, each a list
of commands run in order under their own time limits, with logs and a summary table.

    # on the device (x2 kind; the tool returns at most 8 files, so pack the folder):
    python3 bench/device_plan.py next --out /tmp/r; tar czf $OUT/r.tgz -C /tmp r
    python bench/device_plan.py next --out /tmp/r --dry-run   # here: print what would run

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
    # The next session's first call (docs/benchmarks.md, "In code but not yet measured"):
    # the checks, then Fig. 4 with all three policies on the same code and day.
    "next": (
        Job("gpu0", 0, (
            Step(f"{FIG4} --policies resident,fixed --fixed-expert-share 0.75 --out $JOB_OUT", 530),
        )),
        Job("gpu1", 1, (
            Step("python3 bench/gpu_checks.py --out $JOB_OUT", 180),
            Step(f"{FIG4} --policies elastic --out $JOB_OUT", 300),
        )),
    ),
    # Where a qwen3 step's time goes, and the kernels after any change to them.
    "profile": (
        Job("gpu0", 0, (
            Step("python3 bench/step_profile.py --model qwen3-30b-a3b --memory-budget 59GiB "
                 "--batch 32 --out $JOB_OUT", 300),
        )),
        Job("gpu1", 1, (
            Step("python3 bench/moe_breakdown.py --out $JOB_OUT", 240),
            Step("python3 bench/kernels_gpu.py --tokens 1,1024,2048,4096 --skip-attention "
                 "--out-dir $JOB_OUT", 240),
        )),
    ),
    # One call: the step profile and the kernels on one GPU, the ablation (its gather arm
    # now on the layer's tuned tiles) on the other.
    "profile-ablation": (
        Job("gpu0", 0, (
            Step("python3 bench/step_profile.py --model qwen3-30b-a3b --memory-budget 59GiB "
                 "--batch 32 --out $JOB_OUT", 270),
            Step("python3 bench/kernels_gpu.py --tokens 1,1024,2048,4096 --skip-attention "
                 "--out-dir $JOB_OUT", 250),
        )),
        Job("gpu1", 1, (
            Step("python3 bench/paper_experiments.py ablation --num-prompts 150 "
                 "--out $JOB_OUT", 520),
        )),
    ),
    # Decode CUDA graphs: the GPU check first, a qwen3 step eager vs graphs, and Fig. 4's
    # resident and elastic with graphs (fixed never has every expert resident: no graphs).
    "graphs": (
        Job("gpu0", 0, (
            Step("python3 bench/gpu_checks.py --only graphs,paths,sync,compile --out $JOB_OUT",
                 150),
            Step("python3 bench/step_profile.py --model qwen3-30b-a3b --memory-budget 59GiB "
                 "--batch 32 --enforce-eager --out $JOB_OUT", 190),
            Step("python3 bench/step_profile.py --model qwen3-30b-a3b --memory-budget 59GiB "
                 "--batch 32 --out $JOB_OUT", 190),
        )),
        Job("gpu1", 1, (
            Step(f"{FIG4} --policies resident,elastic --out $JOB_OUT", 530),
        )),
    ),
    # After the inference-mode fix of the device expert table: the graph check again,
    # Fig. 4 elastic with graphs, and the light-load rate sweep (TPOT goal) with graphs.
    "graphs2": (
        Job("gpu0", 0, (
            Step("python3 bench/gpu_checks.py --only graphs --out $JOB_OUT", 90),
            Step("python3 bench/paper_experiments.py rate-sweep --policy resident --rates 1 "
                 "--num-prompts 100 --out $JOB_OUT/resident", 300),
        )),
        Job("gpu1", 1, (
            Step(f"{FIG4} --policies elastic --out $JOB_OUT", 230),
            Step("python3 bench/paper_experiments.py rate-sweep --policy elastic --rates 1 "
                 "--num-prompts 100 --out $JOB_OUT/elastic", 300),
        )),
    ),
    # Next session: device copy-in (expert_copy="device"), whose steps stay CUDA graphs with
    # experts offloaded. Its GPU check first, then Fig. 4's offloading policies with it, to
    # set against the host-copy runs of 2026-11-30 (elastic 754.7, fixed 832.4 tok/s).
    "device-copy": (
        Job("gpu0", 0, (
            Step("python3 bench/gpu_checks.py --only device-copy,graphs,compile --out $JOB_OUT",
                 150),
            Step(f"{FIG4} --policies elastic --expert-copy device --out $JOB_OUT", 300),
        )),
        Job("gpu1", 1, (
            Step(f"{FIG4} --policies fixed --fixed-expert-share 0.75 --expert-copy device "
                 "--out $JOB_OUT", 300),
        )),
    ),
    # After device-copy: the heavy rate sweep that can test the 3.0x goal, with the KV
    # binding for most of the run (1,000 requests at 16 req/s), resident with graphs
    # against elastic with device copy-in (docs/benchmarks.md, Experiment 2's bound).
    "rate-sweep-heavy": (
        Job("gpu0", 0, (
            Step("python3 bench/paper_experiments.py rate-sweep --policy resident --rates 16 "
                 "--num-prompts 1000 --out $JOB_OUT/resident", 540),
        )),
        Job("gpu1", 1, (
            Step("python3 bench/paper_experiments.py rate-sweep --policy elastic --rates 16 "
                 "--num-prompts 1000 --expert-copy device --out $JOB_OUT/elastic", 540),
        )),
    ),
    # After device-copy (04:55 UTC) and the fused norms/RoPE (model/ops.py): the checks (the
    # device-copy one with a pool that must copy; triton == torch tokens), the kernels timed
    # in interleaved rounds (bench/ab_timing.py), a qwen3 step fused vs unfused (eager) and
    # with graphs, and Fig. 4's resident and elastic (device copy-in) on one commit.
    "check-kernels": (
        Job("gpu0", 0, (
            Step("python3 bench/gpu_checks.py --only device-copy,graphs,paths,compile "
                 "--out $JOB_OUT",
                 120),
            Step("python3 bench/kernels_gpu.py --tokens 1,1024,2048,4096 --skip-attention "
                 "--out-dir $JOB_OUT", 120),
            Step(f"{STEP} --enforce-eager --unfused-ops --out $JOB_OUT", 150),
            Step(f"{STEP} --enforce-eager --out $JOB_OUT", 150),
        )),
        Job("gpu1", 1, (
            Step(f"{FIG4} --policies resident --out $JOB_OUT/resident", 180),
            Step(f"{FIG4} --policies elastic --expert-copy device --out $JOB_OUT/elastic", 180),
            Step(f"{STEP} --out $JOB_OUT", 150),
        )),
    ),
    # The last call of 11-30's third session: Experiment 2 at overload again on the fused
    # norms/RoPE commit, the graph check with its per-layer rule, and Fig. 4's fixed with
    # device copy-in on the same commit as check-kernels' resident and elastic.
    "heavy-fused": (
        Job("gpu0", 0, (
            Step("python3 bench/gpu_checks.py --only graphs --out $JOB_OUT", 90),
            Step("python3 bench/paper_experiments.py rate-sweep --policy resident --rates 16 "
                 "--num-prompts 1000 --out $JOB_OUT/resident", 380),
        )),
        Job("gpu1", 1, (
            Step("python3 bench/paper_experiments.py rate-sweep --policy elastic --rates 16 "
                 "--num-prompts 1000 --expert-copy device --out $JOB_OUT/elastic", 360),
            Step(f"{FIG4} --policies fixed --fixed-expert-share 0.75 --expert-copy device "
                 "--out $JOB_OUT/fixed", 160),
        )),
    ),
    # One GPU (nvidia-h200), the session's last minutes: Experiment 2's elastic at overload
    # with max_num_seqs 512. Resident never reached 256 there (KV-bound at ~100), so this
    # lifts only elastic's cap, the bound named in docs/benchmarks.md.
    "heavy-512": (
        Job("gpu0", 0, (
            Step("python3 bench/paper_experiments.py rate-sweep --policy elastic --rates 16 "
                 "--num-prompts 1000 --expert-copy device --max-num-seqs 512 "
                 "--out $JOB_OUT/elastic512", 290),
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
