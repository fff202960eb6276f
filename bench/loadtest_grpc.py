"""Loopback load test of a data plane: N concurrent streaming clients, closed loop.

Each client sends one Generate after another (prompts from a bundled trace, token ids, at
most --max-tokens each with ignore_eos) until --duration seconds have passed, timing every
token as it arrives. Reports request and token throughput and TTFT / ITL / E2E latency
percentiles; the table is the last thing printed.

    python bench/loadtest_grpc.py                      # starts `rimuru serve` (tiny, CPU)
    python bench/loadtest_grpc.py --clients 64 --duration 60 --target 127.0.0.1:50052

Without --target the server runs in its own process (`python -m rimuru serve --port 0`
plus --serve-args), so client and server do not share a GIL, and its resident memory is
sampled every --rss-every seconds: a long run is the soak test that a server's memory
stays flat (`--duration 1800`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from collections import Counter
from itertools import pairwise

import grpc
import numpy as np

from rimuru.dataplane.bench.trace import load_trace
from rimuru.dataplane.engine.sched.request import SamplingParams
from rimuru.dataplane.serve.grpc_front.client import StreamResult, stream_generate
from rimuru.v1 import inference_pb2_grpc as pb_grpc


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default=None, help="host:port; default: start a local server")
    p.add_argument("--clients", type=int, default=16, help="concurrent streaming clients")
    p.add_argument("--duration", type=float, default=20.0, help="seconds of load")
    p.add_argument("--max-tokens", type=int, default=32, help="cap on each request's output")
    p.add_argument("--max-prompt-tokens", type=int, default=256)
    p.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="sampling temperature of every request (0: greedy); seeded per request",
    )
    p.add_argument("--trace", default="sharegpt_qwen_cpu")
    p.add_argument("--timeout", type=float, default=120.0, help="per-request deadline (s)")
    p.add_argument(
        "--serve-args",
        default="--memory-budget 400MiB --max-num-batched-tokens 512",
        help="extra `rimuru serve` flags for the local server",
    )
    p.add_argument("--json", default=None, help="also write the summary to this file")
    p.add_argument(
        "--rss-every", type=float, default=10.0, help="seconds between samples of the local "
        "server's resident memory (Linux /proc)"
    )  # fmt: skip
    args = p.parse_args(argv)
    if args.clients < 1 or args.duration <= 0 or args.max_tokens < 1 or args.temperature < 0:
        p.error("--clients and --max-tokens must be >= 1, --duration > 0, --temperature >= 0")
    return args


class LocalServer:
    """`python -m rimuru serve --port 0` on loopback until closed."""

    def __init__(self, extra_args: str) -> None:
        command = [sys.executable, "-m", "rimuru", "serve", "--host", "127.0.0.1", "--port", "0"]
        self.proc = subprocess.Popen(
            [*command, *shlex.split(extra_args)],
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "RIMURU_LOG_LEVEL": "INFO"},
        )
        self.ready = threading.Event()
        self.port = 0
        self.log: list[str] = []
        threading.Thread(target=self._read_log, daemon=True).start()
        if not self.ready.wait(300) or not self.port:
            self.close()
            raise SystemExit("the local server did not start:\n" + "".join(self.log[-20:]))

    def _read_log(self) -> None:
        for line in self.proc.stderr:
            self.log.append(line)
            if match := re.search(r"data plane on port (\d+)", line):
                self.port = int(match.group(1))
            if "health SERVING" in line or "did not start" in line:
                self.ready.set()
        self.ready.set()

    def rss_mib(self) -> float | None:
        """The server process's resident memory now (None where /proc is not)."""
        try:
            with open(f"/proc/{self.proc.pid}/status") as f:
                kib = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        except (OSError, StopIteration):
            return None
        return kib / 1024

    def sample_rss(self, every: float, until: threading.Event) -> list[tuple[float, float]]:
        """(seconds since the call, MiB) every `every` seconds until `until` is set; the
        list fills in from a thread while the load runs."""
        samples: list[tuple[float, float]] = []
        start = time.monotonic()

        def sample() -> None:
            while not until.wait(every):
                if (mib := self.rss_mib()) is not None:
                    samples.append((time.monotonic() - start, mib))

        threading.Thread(target=sample, daemon=True).start()
        return samples

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()


async def run_load(args: argparse.Namespace, target: str) -> tuple[list[StreamResult], float]:
    trace = load_trace(args.trace)
    prompts = [r.prompt_token_ids[: args.max_prompt_tokens] for r in trace.requests]
    outputs = [min(r.output_len, args.max_tokens) for r in trace.requests]
    results: list[StreamResult] = []
    next_prompt = 0
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.InferenceStub(channel)
        start = time.monotonic()
        stop_at = start + args.duration

        async def client() -> None:
            nonlocal next_prompt
            while time.monotonic() < stop_at:
                i = next_prompt % len(prompts)
                next_prompt += 1
                params = SamplingParams(
                    max_tokens=outputs[i],
                    ignore_eos=True,
                    temperature=args.temperature,
                    seed=i if args.temperature > 0 else None,
                )
                results.append(
                    await stream_generate(stub, prompts[i], params, timeout_s=args.timeout)
                )

        await asyncio.gather(*(client() for _ in range(args.clients)))
        duration = time.monotonic() - start
    return results, duration


def summarize(results: list[StreamResult], duration: float, clients: int) -> dict:
    ok = [r for r in results if r.ok and r.token_times]
    ttft = [r.token_times[0] - r.sent_time for r in ok]
    e2e = [r.token_times[-1] - r.sent_time for r in ok]
    itl = [b - a for r in ok for a, b in pairwise(r.token_times)]
    output_tokens = sum(len(r.token_ids) for r in ok)

    def pct(samples: list[float]) -> dict[str, float]:
        if not samples:
            return {"p50_ms": 0.0, "p90_ms": 0.0, "p99_ms": 0.0}
        ms = np.asarray(samples) * 1000.0
        return {f"p{q}_ms": float(np.percentile(ms, q)) for q in (50, 90, 99)}

    return {
        "clients": clients,
        "duration_s": duration,
        "completed": len(ok),
        "failed": dict(Counter(r.status.name for r in results if not r.ok)),
        "request_throughput": len(ok) / duration,
        "output_tok_s": output_tokens / duration,
        "prompt_tok_s": sum(r.prompt_tokens for r in ok) / duration,
        "ttft": pct(ttft),
        "itl": pct(itl),
        "e2e": pct(e2e),
    }


def format_table(s: dict) -> str:
    rows = [("metric", "p50 ms", "p90 ms", "p99 ms")]
    for name in ("ttft", "itl", "e2e"):
        rows.append((name.upper(), *(f"{s[name][f'p{q}_ms']:.1f}" for q in (50, 90, 99))))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    failed = ", ".join(f"{k} {v}" for k, v in s["failed"].items()) or "none"
    head = (
        f"{s['clients']} clients, {s['duration_s']:.1f} s: {s['completed']} requests "
        f"({s['request_throughput']:.2f} req/s), {s['output_tok_s']:.1f} output tok/s, "
        f"{s['prompt_tok_s']:.1f} prompt tok/s; failed: {failed}"
    )
    rss = s.get("server_rss_mib") or []
    if len(rss) >= 2:  # the first sample is taken after warm-up's allocations settle
        first, last = rss[0][1], rss[-1][1]
        peak = max(m for _, m in rss)
        head += (
            f"\nserver RSS: {first:.1f} MiB at {rss[0][0]:.0f} s, {last:.1f} MiB at "
            f"{rss[-1][0]:.0f} s ({last - first:+.1f} MiB), peak {peak:.1f} MiB"
        )
    return head + "\n" + "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    server = None if args.target else LocalServer(args.serve_args)
    done, rss = threading.Event(), []
    try:
        target = args.target or f"127.0.0.1:{server.port}"
        if server is not None:
            rss = server.sample_rss(args.rss_every, done)
        results, duration = asyncio.run(run_load(args, target))
    finally:
        done.set()
        if server is not None:
            server.close()
    summary = summarize(results, duration, args.clients)
    summary["server_rss_mib"] = [[round(t, 1), round(m, 1)] for t, m in rss]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    print(format_table(summary))
    return 0 if summary["completed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
