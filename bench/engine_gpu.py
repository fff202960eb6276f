"""The engine on the H200, in one call: policy equivalence with the Triton kernels, then the
paper's Fig. 4 experiment (resident / fixed / elastic on one budget).

    python bench/engine_gpu.py --out $OUT [--num-prompts 300] [--skip-a] [--skip-fig4]
        [--policies resident,fixed,elastic] [--expert-offload-limit 10] [--router-skew 1.0]
        [--fixed-expert-share 0.5]

Part A (correctness): `tiny` preset in fp32 on CUDA with a budget so tight that preemption
and eviction happen: greedy tokens must be identical under the three policies with the
Triton kernels, and identical to the torch reference path on the same device.
Part B (Fig. 4): `qwen1.5-moe-a2.7b` preset (bf16), budget 0.9 x 32 GiB (an RTX 5090),
ShareGPT at 10 req/s, three policies; results.json + fig4 PNG under --out.
Prints a short table last.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
from pathlib import Path

import torch

from rimuru.cli import main as rimuru_main
from rimuru.dataplane.engine.config import EngineConfig
from rimuru.dataplane.engine.engine import Engine
from rimuru.dataplane.engine.request import SamplingParams
from rimuru.policy import Tunables

MiB = 2**20


def part_a() -> dict:
    rng = random.Random(7)
    prompts = [[rng.randrange(151_000) for _ in range(rng.randint(40, 110))] for _ in range(14)]
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    probe = Engine(EngineConfig(device="cuda", activation_reserve=0), log_plan=False)
    budget = (
        probe.model.resident_nbytes() + 2 * 3 * 32 * probe.geometry.expert_page_bytes + 26 * MiB
    )
    del probe
    outputs, stats = {}, {}
    for kernels in (True, False):
        for mode in ("resident", "fixed", "elastic"):
            engine = Engine(
                EngineConfig(
                    device="cuda",
                    memory_budget=budget,
                    activation_reserve=0,
                    max_num_batched_tokens=128,
                    loading_buffer_slots=32,
                    use_kernels=kernels,
                    tunables=Tunables(mode=mode, expert_offload_limit=16),
                ),
                log_plan=False,
            )
            outputs[(mode, kernels)] = engine.generate(prompts, params)
            engine.check_invariants()
            c = engine.experts.counters
            stats[(mode, kernels)] = (
                engine.scheduler.num_preemptions,
                c.evictions,
                c.buffer_copies,
                engine.num_leaked_pages(),
            )
    same = len({json.dumps(v) for v in outputs.values()}) == 1
    name = {key: f"{key[0]}/{'triton' if key[1] else 'torch'}" for key in outputs}
    first: dict[str, int] = {}
    groups = {name[key]: first.setdefault(json.dumps(v), len(first)) for key, v in outputs.items()}
    flat_ref = [t for seq in outputs[("resident", False)] for t in seq]
    agreement = {
        name[key]: sum(a == b for a, b in zip([t for seq in v for t in seq], flat_ref, strict=True))
        / len(flat_ref)
        for key, v in outputs.items()
    }
    return {
        "identical_tokens_all_6_runs": same,
        "token_groups": groups,  # runs with identical tokens share a group id
        "token_agreement_with_resident_torch": agreement,
        "stats(preemptions,evictions,buffer_copies,leaked)": {name[k]: v for k, v in stats.items()},
    }


def main() -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False)
    ap.add_argument("--out", required=True)
    ap.add_argument("--num-prompts", type=int, default=300)
    ap.add_argument("--skip-a", action="store_true")
    ap.add_argument("--skip-fig4", action="store_true")
    ap.add_argument("--router-skew", default="1.0")
    ap.add_argument("--expert-offload-limit", default="10")
    ap.add_argument("--policies", default="resident,fixed,elastic")
    ap.add_argument("--fixed-expert-share", default="0.5")
    args, passthrough = ap.parse_known_args()  # other flags go to `rimuru bench`
    fixed = {"--device", "--model", "--memory-budget", "--trace", "--request-rate",
             "--max-num-batched-tokens", "--output-dir", "--no-progress"}  # fmt: skip
    clashing = [a for a in passthrough if a.split("=", 1)[0] in fixed]
    if clashing:
        ap.error(f"{clashing} are fixed by the Fig. 4 setup of this script")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d")}
    if not args.skip_a:
        t = time.time()
        summary["part_a"] = part_a()
        summary["part_a"]["seconds"] = round(time.time() - t, 1)
        print("part A:", json.dumps(summary["part_a"]), flush=True)
        gc.collect()
        torch.cuda.empty_cache()
    if not args.skip_fig4:
        t = time.time()
        code = rimuru_main(
            [
                "bench",
                "--device", "cuda",
                "--model", "qwen1.5-moe-a2.7b",
                "--memory-budget", "28.8GiB",
                "--trace", "sharegpt_qwen_1000",
                "--num-prompts", str(args.num_prompts),
                "--request-rate", "10",
                "--max-num-batched-tokens", "2048",
                "--expert-offload-limit", args.expert_offload_limit,
                "--router-skew", args.router_skew,
                "--policies", args.policies,
                "--fixed-expert-share", args.fixed_expert_share,
                "--output-dir", str(out / f"fig4_skew{args.router_skew}_limit{args.expert_offload_limit}"),
                "--no-progress",
                *passthrough,
            ]
        )  # fmt: skip
        summary["fig4_exit"] = code
        summary["fig4_seconds"] = round(time.time() - t, 1)
    (out / "engine_gpu_summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
