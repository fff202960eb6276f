"""Where one engine step's time goes: host work against device work, at a steady decode batch.

    python3 bench/step_profile.py --model qwen3-30b-a3b --memory-budget 59GiB --batch 32  # GPU
    python3 bench/step_profile.py --model qwen3-30b-a3b --batch 1,32,64,256 --steps 10      # GPU, sweep
    python bench/step_profile.py --model tiny --device cpu --batch 4 --steps 3             # CPU smoke

Eager steps of a 48-layer model can be bound by host work between kernel launches rather
than by the GPU. This script makes that measurable: it fills the engine with
`--batch` requests from the trace (prompts cut to `--prompt-len`), runs the prefill, then
profiles `--steps` decode steps with torch.profiler and reports per step:

  wall ms          the median step as the caller sees it (the first decode step after the
                   prefill can be far off either way: it runs without a step in flight,
                   or behind the prefill's last one)
  device busy ms   union of the device's kernel and copy intervals, per step (CUDA only)
  host-only ms     wall - device busy: time the GPU sat idle waiting for the host
  launches         kernels + copies launched
  top host ops     self CPU time of the heaviest operators / Python functions
  top kernels      device time of the heaviest kernels (CUDA only; graph replays' kernels
                   are counted one by one)
  roofline ms      the bytes a decode step must read over HBM bandwidth (`decode_roofline`):
                   the experts one more decode step routes to, counted, other weights, KV

`--batch` takes a comma-separated list: one engine serves each batch in turn (drained
between them), so a sweep loads the model once.

With `--prefill-tokens N` every measured step also takes one new request's N-token prompt
whole, beside the decodes: a mixed step, which the decode graphs do not serve (piecewise
graphs do; `--cudagraph-mode full_decode_only` runs them eagerly, for the comparison).
Each step count is measured twice: first plain (`wall_ms_plain`: no profiler, whose
per-operator hooks slow an eager step's host side), then under the profiler.

Prints a short table last; the full report goes to OUT/step_profile.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from rimuru.dataplane.bench.trace import load_trace
from rimuru.dataplane.engine.engine import Engine
from rimuru.dataplane.engine.flags import on_off
from rimuru.dataplane.engine.sched.request import SamplingParams
from rimuru.dataplane.engine.startup.config import CUDAGRAPH_MODES, EngineConfig
from rimuru.kernels.moe_bench import PEAK_BYTES
from rimuru.policy import Tunables
from rimuru.sizes import parse_bytes


def busy_ms(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals (µs in, ms out): overlapping kernels on
    several streams count once."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total / 1e3


def fill(engine: Engine, trace_name: str, batch: int, prompt_len: int, decode_steps: int) -> None:
    trace = load_trace(trace_name)
    if len(trace) < batch:
        raise ValueError(f"trace {trace_name} holds {len(trace)} requests; --batch is {batch}")
    # Enough tokens to stay in decode for every measured step (plain, profiled and the
    # roofline's), whatever decodes ran while a large batch's prompts were still chunked in:
    # the batch must not shrink. drain() aborts the rest.
    params = SamplingParams(max_tokens=decode_steps + 1024, ignore_eos=True)
    for i, request in enumerate(trace.requests[:batch]):
        engine.add_request(list(request.prompt_token_ids[:prompt_len]), params, f"profile-{i}")
    for _ in range(1000):  # prefill (chunked) until every request decodes
        engine.step()
        running = engine.scheduler.running
        if len(running) == batch and all(r.num_tokens_to_compute == 1 for r in running):
            return
    raise RuntimeError("the batch never reached steady decode; raise the memory budget")


def timed_steps(
    engine: Engine, steps: int, prompts: list[list[int]], running: list[int]
) -> list[float]:
    """Wall ms of `steps` steps; before each, one prompt from `prompts` (if any) joins.
    Appends to `running` the requests decoding in each step (the batch must not shrink)."""
    walls = []
    for _ in range(steps):
        if prompts:
            engine.add_request(prompts.pop(), SamplingParams(max_tokens=4 * steps, ignore_eos=True))
        running.append(sum(r.num_tokens_to_compute == 1 for r in engine.scheduler.running))
        t0 = time.perf_counter()
        engine.step()
        walls.append((time.perf_counter() - t0) * 1e3)
    return walls


def profile_steps(engine: Engine, steps: int, prompts: list[list[int]]) -> dict:
    cuda = engine.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    running: list[int] = []
    plain = timed_steps(engine, steps, prompts, running)
    with profile(activities=activities) as prof:
        walls = timed_steps(engine, steps, prompts, running)
    events = prof.events()
    device = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    intervals = [(e.time_range.start, e.time_range.end) for e in device]
    wall = statistics.median(walls)
    busy = busy_ms(intervals) / steps if cuda else None
    top = sorted(prof.key_averages(), key=lambda a: a.self_cpu_time_total, reverse=True)[:12]
    kernels: dict[str, list[float]] = {}  # name -> [launches, µs]
    for e in device:
        row = kernels.setdefault(e.name, [0, 0.0])
        row[0] += 1
        row[1] += e.time_range.end - e.time_range.start
    return {
        "steps": steps,
        "wall_ms_plain": statistics.median(plain),
        "wall_ms_plain_each": plain,
        "wall_ms": wall,
        "wall_ms_each": walls,
        "decoding_each": running,  # plain steps, then profiled ones
        "device_busy_ms": busy,
        "host_only_ms": None if busy is None else wall - busy,
        "device_launches_per_step": len(device) / steps if cuda else None,
        "top_host_ops": [_op_row(a, steps) for a in top],
        "top_device_kernels": [
            {"name": name, "calls_per_step": n / steps, "device_ms_per_step": us / 1e3 / steps}
            for name, (n, us) in sorted(kernels.items(), key=lambda kv: -kv[1][1])[:40]
        ],
    }


@dataclass(frozen=True)
class Roofline:
    """A decode step's HBM roofline: the bytes one step must read, over the card's copy
    bandwidth. Counted: the experts the step routes to (each distinct (layer, expert) once:
    w1, w3, w2), every other weight a step reads (attention, norms, routers, shared experts,
    lm_head; not the embedding table, of which a step reads one row per token), and the KV
    cache each decoding request attends over. Not counted: activations, the KV written,
    sampling: small beside the weights at these batches, so the bound stays a lower bound on
    the step time."""

    expert_bytes: int
    other_weight_bytes: int
    kv_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.expert_bytes + self.other_weight_bytes + self.kv_bytes

    @property
    def ms(self) -> float:
        return self.total_bytes / PEAK_BYTES * 1e3

    def to_dict(self) -> dict:
        return {**asdict(self), "total_bytes": self.total_bytes, "ms": self.ms}


def decode_roofline(engine: Engine, distinct_experts: int, contexts: list[int]) -> Roofline:
    """`distinct_experts`: (layer, expert) pairs the step routed to, summed over layers;
    `contexts`: each decoding request's tokens attended over."""
    shape = engine.geometry.shape
    config = engine.model_config
    embedding = 0 if config.tie_word_embeddings else config.vocab_size * config.hidden_size
    kv_per_token = shape.kv_page_bytes // shape.block_size  # one layer's K and V of one token
    return Roofline(
        expert_bytes=distinct_experts * 3 * shape.expert_page_bytes,
        other_weight_bytes=engine.plan.non_pool_weight_bytes - embedding * shape.dtype_bytes,
        kv_bytes=sum(contexts) * config.num_kv_layers * kv_per_token,
    )


def measure_roofline(engine: Engine) -> dict:
    """One more decode step with routing counted: the distinct experts it touched and the
    contexts it attended over give its roofline (`decode_roofline`)."""
    running = [r for r in engine.scheduler.running if r.num_tokens_to_compute == 1]
    contexts = [r.num_tokens for r in running]
    if engine.device.type == "cuda":  # async: the step in flight routes before the reset
        torch.cuda.synchronize(engine.device)
    engine.moe_backend.reset_routing_counts()
    engine.step()
    distinct = int((engine.moe_backend.routing_counts > 0).sum())
    roofline = decode_roofline(engine, distinct, contexts)
    return {"distinct_experts": distinct, "decoding": len(running), **roofline.to_dict()}


def drain(engine: Engine) -> None:
    """Abort what the last batch left, and step until its pages are reclaimed."""
    for request_id in list(engine.requests):
        engine.abort(request_id)
    while engine.has_unfinished_requests():
        engine.step()


def joining_prompts(trace_name: str, tokens: int, count: int) -> list[list[int]]:
    """`count` prompts of exactly `tokens` tokens (trace prompts, repeated to length), or none."""
    if tokens == 0:
        return []
    requests = load_trace(trace_name).requests[-count:]
    out = []
    for r in requests:
        ids = list(r.prompt_token_ids)
        out.append((ids * (tokens // len(ids) + 1))[:tokens])
    return out


def _op_row(average, steps: int) -> dict:
    return {
        "name": average.key,
        "calls_per_step": average.count / steps,
        "self_cpu_ms_per_step": average.self_cpu_time_total / 1e3 / steps,
    }


def profile_batch(engine: Engine, args: argparse.Namespace, batch: int) -> dict:
    fill(engine, args.trace, batch, args.prompt_len, 2 * args.steps)  # plain + profiled
    prompts = joining_prompts(args.trace, args.prefill_tokens, 2 * args.steps)
    report = {
        "command": " ".join(["python", *sys.argv]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "device": torch.cuda.get_device_name() if engine.device.type == "cuda" else "cpu",
        "model": args.model,
        "policy": args.policy,
        "batch": batch,
        "prompt_len": args.prompt_len,
        "prefill_tokens": args.prefill_tokens,
        "cuda_graphs": engine.cuda_graphs.decode is not None,
        "cudagraph_mode": args.cudagraph_mode,
        "piecewise_graphs": engine.cuda_graphs.piecewise is not None,
        "layer_ops": type(engine.model.ops).__name__,  # TorchOps on the CPU path whatever the flag
        "layers": engine.model_config.num_layers,
        **profile_steps(engine, args.steps, prompts),
        "roofline": measure_roofline(engine),
    }
    drain(engine)
    return report


def print_top_ops(report: dict) -> None:
    if report["top_host_ops"]:
        print(f"{'op':60s} {'calls/step':>10s} {'self ms/step':>12s}")
    for op in report["top_host_ops"]:
        print(
            f"{op['name'][:60]:60s} {op['calls_per_step']:10.1f} {op['self_cpu_ms_per_step']:12.3f}"
        )
    if report["top_device_kernels"]:
        print(f"\n{'kernel (batch ' + str(report['batch']) + ')':60s} {'calls/step':>10s} "
              f"{'device ms/step':>14s}")  # fmt: skip
    for k in report["top_device_kernels"][:16]:  # the JSON holds 40
        print(f"{k['name'][:60]:60s} {k['calls_per_step']:10.1f} {k['device_ms_per_step']:14.3f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-30b-a3b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--memory-budget", default=None, help="e.g. 59GiB (default: the device's)")
    ap.add_argument("--policy", default="resident", choices=("resident", "fixed", "elastic"))
    ap.add_argument(
        "--batch", default="32", help="requests decoding together; a comma-separated list sweeps"
    )
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=20, help="decode steps profiled")
    ap.add_argument("--trace", default="sharegpt_qwen_1000")
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument(
        "--enforce-eager", action="store_true", help="no CUDA graphs (decode or piecewise)"
    )
    ap.add_argument(
        "--prefill-tokens",
        type=int,
        default=0,
        help="each measured step also prefills one new N-token prompt (mixed step)",
    )
    ap.add_argument("--cudagraph-mode", default=CUDAGRAPH_MODES[0], choices=CUDAGRAPH_MODES)
    ap.add_argument("--async-scheduling", nargs="?", const="on", default="auto",
                    choices=("on", "off", "auto"),
                    help="schedule and launch each step before reading the last one back "
                         "(auto, the engine's default: on with CUDA)")  # fmt: skip
    ap.add_argument("--unfused-ops", action="store_true",
                    help="norms, RoPE and the router's top-k in torch, not fused kernels (the "
                         "before of model/ops.py)")  # fmt: skip
    args = ap.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("step_profile.py: no CUDA device here; use --device cpu", file=sys.stderr)
        return 2
    try:
        batches = [int(b) for b in str(args.batch).split(",")]
    except ValueError:
        batches = [0]
    if min(batches) < 1 or args.steps < 1 or args.prompt_len < 1 or args.prefill_tokens < 0:
        print("step_profile.py: --batch (integers, comma-separated), --steps and --prompt-len "
              "must be >= 1, "
              "--prefill-tokens >= 0", file=sys.stderr)  # fmt: skip
        return 2
    # the last measured step: the batch, the prompts joined so far (decoding), a new one
    widest = max(batches) + (2 * args.steps - 1) + args.prefill_tokens if args.prefill_tokens else 0
    if widest > EngineConfig.max_num_batched_tokens:
        print(f"step_profile.py: the last mixed step would hold {widest} tokens, over the "
              f"{EngineConfig.max_num_batched_tokens} of max_num_batched_tokens: the prompt "
              "would be chunked; lower --batch, --steps or --prefill-tokens", file=sys.stderr)  # fmt: skip
        return 2
    config = EngineConfig(
        model=args.model,
        device=args.device,
        memory_budget=parse_bytes(args.memory_budget) if args.memory_budget else None,
        gpu_memory_utilization=None if args.memory_budget or args.device == "cpu" else 0.9,
        tunables=Tunables(mode=args.policy, expert_offload_limit=0 if args.policy == "resident" else 8),
        # room for the prompts that join (two per measured step) beside the batch
        max_num_seqs=max(batches) + (2 * args.steps if args.prefill_tokens else 0),
        enforce_eager=args.enforce_eager,
        cudagraph_mode=args.cudagraph_mode,
        fused_layer_ops=not args.unfused_ops,
        async_scheduling=on_off("--async-scheduling", args.async_scheduling, auto=True),
    )  # fmt: skip
    engine = Engine(config)
    scheduled_async = config.schedules_async
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for batch in batches:
        report = profile_batch(engine, args, batch)
        rows.append(report)
        name = (
            "step_profile" + "_eager" * args.enforce_eager + "_unfused" * args.unfused_ops
            + f"_prefill{args.prefill_tokens}" * bool(args.prefill_tokens)
            + "_decode_only" * (args.cudagraph_mode == "full_decode_only")
            + "_async" * scheduled_async
            + f"_b{batch}" * (len(batches) > 1) + ".json"
        )  # fmt: skip
        (args.out / name).write_text(json.dumps(report, indent=1) + "\n")
    for row in rows[:-1]:  # the device kernels of every batch; the host ops of the last
        print_top_ops({**row, "top_host_ops": []})
    print_top_ops(rows[-1])
    mode = (
        ("CUDA graphs" if rows[0]["cuda_graphs"] else "eager")
        + (" + piecewise" if rows[0]["piecewise_graphs"] else "")
        + (", unfused ops" if args.unfused_ops else "")
        + (f", +1 prompt of {args.prefill_tokens} per step" if args.prefill_tokens else "")
        + (", async scheduling" if scheduled_async else ", synchronous scheduling")
    )
    print(f"\n{args.model} ({rows[0]['layers']} layers), {args.policy}, {mode}, "
          f"prompts of {args.prompt_len} tokens")  # fmt: skip
    print(f"{'batch':>5s} {'wall ms':>8s} {'profiled':>8s} {'busy ms':>8s} {'host-only':>9s} "
          f"{'host %':>6s} {'launch':>6s} {'experts':>7s} {'roof ms':>7s} {'roof/wall':>9s}")  # fmt: skip
    for r in rows:
        busy, roof = r["device_busy_ms"], r["roofline"]
        host = (
            ""
            if busy is None
            else f"{r['host_only_ms']:9.2f} {100 * r['host_only_ms'] / r['wall_ms']:6.1f} {r['device_launches_per_step']:6.0f}"
        )
        print(f"{r['batch']:5d} {r['wall_ms_plain']:8.2f} {r['wall_ms']:8.2f} "
              + (f"{busy:8.2f} {host}" if busy is not None else f"{'-':>8s} {'-':>9s} {'-':>6s} {'-':>6s}")
              + f" {roof['distinct_experts']:7d} {roof['ms']:7.2f} {roof['ms'] / r['wall_ms_plain']:9.2f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
