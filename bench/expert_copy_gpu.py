"""How fast device copy-in moves experts over PCIe: the copy kernel (kernels/expert_copy.py)
against the copy engines (cudaMemcpyAsync from pinned memory) moving the same bytes, on one
GPU, in one call.

    python3 bench/expert_copy_gpu.py [--out DIR] [--rounds 7]     # CUDA only

Why: with device copy-in (the default) every step copies each routed, offloaded expert from
pinned host memory, on the compute stream, before the MoE reads it. At overload that was
1.3–1.5 TB per Experiment 2 run (docs/benchmarks.md), so the copy's bandwidth bounds an
elastic step. It had not been measured. Here, per model shape and k routed experts:

  memcpy    3k `copy_` calls, pinned host -> device, non_blocking: the copy engines, the
            bandwidth the host path gets (54.7 GB/s measured on this H200 for one large copy)
  kernel    `copy_routed_experts` at the engine's launch settings, and at every launch of a
            small sweep (programs per matrix, elements per loop step, warps)

Every variant runs 5 calls per round, in turn (drift hits all alike), each after an L2
flush; the figure is the median over rounds of the round's median call. The engine's launch
is checked against the host matrices here; the sweep's other launches copy the same bytes
in the CPU tests (tests/kernels/test_expert_copy.py). Prints a short table last;
OUT/expert_copy_gpu.json holds every figure.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from ab_timing import flushed_calls

from rimuru.kernels.expert_copy import copy_routed_experts

SHAPES = {  # E, I, D and the routed counts k timed (of S = min(E, 32) offloaded)
    "qwen3-30b-a3b": (128, 768, 2048, (1, 4, 16, 32)),
    "qwen1.5-moe-a2.7b": (60, 1408, 2048, (1, 4, 16, 32)),
    "mixtral-8x7b": (8, 14336, 4096, (1, 2, 4, 8)),
}
SWEEP = list(itertools.product((8, 32, 128), (1024, 4096), (4, 8)))  # programs, block, warps
DEFAULT = (8, 4096, 4)


def time_calls(fns: dict[str, Callable[[], None]], rounds: int, calls: int) -> dict[str, float]:
    """Median over rounds of seconds per call, each round running every fn `calls` times,
    each call timed alone after an L2 flush: the H200's 50 MB L2 could otherwise serve a
    re-read of the same host bytes, which serving never re-reads within a step."""
    one_round = flushed_calls(calls)
    for fn in fns.values():  # warm-up: compiled, clocks up
        fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            samples[name].append(statistics.median(one_round(fn)))
    return {name: statistics.median(v) for name, v in samples.items()}


def bench_shape(name: str, rounds: int) -> list[dict]:
    E, inter, hidden, ks = SHAPES[name]
    slots = min(E, 32)
    gen = torch.Generator().manual_seed(0)
    host = [torch.randn(E, a, b, generator=gen).to(torch.bfloat16).pin_memory()
            for a, b in ((inter, hidden), (inter, hidden), (hidden, inter))]  # fmt: skip
    dev = torch.device("cuda")
    buffer = torch.empty(3 * slots, inter * hidden, dtype=torch.bfloat16, device=dev)
    order = torch.randperm(E, generator=gen)[:slots]
    offloaded = order.to(torch.int32).to(dev)  # slot s holds expert order[s]
    copied = torch.zeros(1, dtype=torch.int32, device=dev)
    rows = []
    for k in ks:
        routed = order[torch.randperm(slots, generator=gen)[:k]].tolist()
        counts = torch.zeros(E, dtype=torch.int64)
        counts[routed] = 1
        counts = counts.to(dev)
        nbytes = 3 * k * inter * hidden * 2
        pairs = [(buffer[3 * order.tolist().index(e) + m], host[m][e].reshape(-1))
                 for e in routed for m in range(3)]  # fmt: skip

        def memcpy(pairs=pairs):
            for dst, src in pairs:
                dst.copy_(src, non_blocking=True)

        fns = {"memcpy": memcpy}
        for p, b, w in SWEEP:
            fns[f"kernel p{p} b{b} w{w}"] = (
                lambda p=p, b=b, w=w, counts=counts: copy_routed_experts(
                    counts, offloaded, *host, buffer, copied,
                    programs_per_matrix=p, block=b, num_warps=w,
                )
            )  # fmt: skip
        # the kernel's copies are right (the default launch, on a poisoned buffer)
        buffer.fill_(float("nan"))
        fns["kernel p{} b{} w{}".format(*DEFAULT)]()
        torch.cuda.synchronize()
        for e in routed:
            for m in range(3):
                got = buffer[3 * order.tolist().index(e) + m, : inter * hidden].cpu()
                if not torch.equal(got, host[m][e].reshape(-1)):
                    raise AssertionError(f"{name}: expert {e} matrix {m} copied wrong")
        seconds = time_calls(fns, rounds, calls=5)
        default = seconds["kernel p{} b{} w{}".format(*DEFAULT)]
        best_name = min((n for n in seconds if n != "memcpy"), key=seconds.get)
        rows.append({
            "model": name, "routed": k, "slots": slots, "mbytes": nbytes / 1e6,
            "memcpy_gbps": nbytes / seconds["memcpy"] / 1e9,
            "kernel_default_gbps": nbytes / default / 1e9,
            "kernel_best": best_name, "kernel_best_gbps": nbytes / seconds[best_name] / 1e9,
            "all_gbps": {n: nbytes / s / 1e9 for n, s in seconds.items()},
        })  # fmt: skip
        print(json.dumps({key: rows[-1][key] for key in list(rows[-1])[:-1]}), flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--models", default=",".join(SHAPES))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print(
            "expert_copy_gpu.py: needs CUDA (the kernel reads pinned host memory)", file=sys.stderr
        )
        return 2
    unknown = [m for m in args.models.split(",") if m not in SHAPES]
    if unknown:
        ap.error(f"unknown models {unknown}: choose from {', '.join(SHAPES)}")
    t0 = time.time()
    rows = [r for m in args.models.split(",") for r in bench_shape(m, args.rounds)]
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": " ".join(["python3", *sys.argv]),
        "device": torch.cuda.get_device_name(),
        "default_launch": {"programs_per_matrix": DEFAULT[0], "block": DEFAULT[1], "num_warps": DEFAULT[2]},
        "seconds": round(time.time() - t0, 1),
        "rows": rows,
    }  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "expert_copy_gpu.json").write_text(json.dumps(report, indent=1) + "\n")
    print(
        f"\n{'model':18s} {'k':>3s} {'MB':>7s} {'memcpy':>7s} {'kernel':>7s} {'best':>7s}  best launch (GB/s)"
    )
    for r in rows:
        print(f"{r['model']:18s} {r['routed']:3d} {r['mbytes']:7.1f} {r['memcpy_gbps']:7.1f} "
              f"{r['kernel_default_gbps']:7.1f} {r['kernel_best_gbps']:7.1f}  {r['kernel_best']}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
