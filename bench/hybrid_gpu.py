"""Hybrid models (Gated DeltaNet + gated attention + MoE) on the GPU, one run each.

    python3 bench/hybrid_gpu.py checks --out $OUT      # kernels at real shapes, tokens
    python3 bench/hybrid_gpu.py full-memory --out $OUT # qwen3.5-35b-a3b, 1,000-request burst
    python3 bench/hybrid_gpu.py just-fits --out $OUT   # weights + 4 GiB, 300-request burst

checks: (1) the state kernels at Qwen3.5-35B-A3B's shapes (16 key / 32 value heads of 128,
  8,192 conv channels, kernel 4) in bf16 against the fp32 torch references — the gated delta
  rule's decode kernel and the chunked prefill (fla-core when installed), the conv's decode
  and prefill kernels, states read from and written to padded pool pages; (2) greedy tokens
  of the fp32 `tiny-hybrid` preset under resident, fixed and a tight elastic, with the Triton
  kernels and with the torch path on the same device (the presets' random weights differ
  between CPU and CUDA generators, so both paths run on CUDA), synchronously, and resident
  and elastic with async scheduling.
full-memory: resident at --gpu-memory-utilization 0.9, --max-num-seqs 512, the first 1,000
  requests of the bundled ShareGPT trace all at once (vLLM's anchor on the same model and
  GPU: docs/benchmarks.md).
just-fits: budget = every weight + 4 GiB, the first 300 requests at once, resident and
  elastic (--expert-offload-limit 32) on one budget.
Presets carry seeded random weights: the figures measure the serving system. Prints a
short table last.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path

import torch

from rimuru.cli import main as rimuru_main
from rimuru.dataplane.engine.engine import Engine
from rimuru.dataplane.engine.sched.request import SamplingParams
from rimuru.dataplane.engine.startup.capacity import non_pool_weight_bytes
from rimuru.dataplane.engine.startup.config import EngineConfig
from rimuru.dataplane.model.checkpoint import preset_config
from rimuru.dataplane.model.hybrid import gated_delta
from rimuru.dataplane.model.hybrid.causal_conv import causal_conv1d
from rimuru.policy import Tunables

GiB = 2**30
MODEL = "qwen3.5-35b-a3b"


def _pages(num_pages: int, shape: tuple[int, ...], dtype, pad: int) -> torch.Tensor:
    """A [P, *shape] view whose page stride exceeds the page (a padded pool slot)."""
    size = 1
    for d in shape:
        size *= d
    slots = torch.randn(num_pages, size + pad, device="cuda").to(dtype)
    return slots[:, :size].view(num_pages, *shape)


def _err(got: torch.Tensor, want: torch.Tensor) -> str:
    d = (got.float() - want.float()).abs()
    return f"max abs {d.max().item():.2e}, rel {(d.norm() / want.float().norm()).item():.2e}"


def kernel_checks() -> list[tuple[str, str]]:
    from rimuru.dataplane.engine.forward.paged_states import StepPart, _fla_chunk_prefill
    from rimuru.kernels import causal_conv_decode, causal_conv_prefill, gated_delta_decode

    gdn = preset_config(MODEL).linear_attention
    hk, hv, dk, dv = gdn.num_key_heads, gdn.num_value_heads, gdn.key_head_dim, gdn.value_head_dim
    cc, kernel = gdn.conv_dim, gdn.conv_kernel_size
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []

    def inputs(t: int):
        q = torch.nn.functional.normalize(
            torch.randn(t, hk, dk, device="cuda", generator=gen), dim=-1
        )
        k = torch.nn.functional.normalize(
            torch.randn(t, hk, dk, device="cuda", generator=gen), dim=-1
        )
        v = torch.randn(t, hv, dv, device="cuda", generator=gen).bfloat16()
        g = -torch.rand(t, hv, device="cuda", generator=gen) * 0.5
        beta = torch.rand(t, hv, device="cuda", generator=gen)
        return q, k, v, g, beta

    # gated delta rule, decode: 64 sequences, one token each, pages 0, 2, 4, ...
    states = _pages(160, (hv, dk, dv), torch.float32, pad=4096) * 0.1
    pages = torch.arange(0, 128, 2, device="cuda")
    q, k, v, g, beta = inputs(64)
    before = states[pages].clone()
    out = gated_delta_decode(q, k, v, g, beta, states, pages)
    want_o, want_s = [], []
    for i in range(64):
        r = slice(i, i + 1)
        o, s = gated_delta.recurrent(q[r], k[r], v[r].float(), g[r], beta[r], before[i].clone())
        want_o.append(o)
        want_s.append(s)
    rows.append(("gdn decode out (bf16 v)", _err(out, torch.cat(want_o))))
    rows.append(("gdn decode state", _err(states[pages], torch.stack(want_s))))
    # chunked prefill of varlen sequences from nonzero states
    prefill = _fla_chunk_prefill()
    lengths = [300, 17, 1, 64, 130]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda")
    q, k, v, g, beta = inputs(sum(lengths))
    pages = torch.tensor([3, 9, 1, 50, 7], device="cuda")
    before = states[pages].clone()
    if prefill is None:
        rows.append(("gdn chunked prefill", "fla-core not installed: torch path"))
    else:
        part = StepPart(None, pages[None], pages[None], cu.to(torch.int32), cu, cu.cpu())
        out = prefill(q, k, v, g, beta, states, pages, part)
        outs, finals = [], []
        for i, n in enumerate(lengths):
            r = slice(int(cu[i]), int(cu[i]) + n)
            o, s = gated_delta.chunked(q[r], k[r], v[r].float(), g[r], beta[r], before[i].clone())
            outs.append(o)
            finals.append(s)
        rows.append(("gdn prefill out (fla, bf16)", _err(out, torch.cat(outs))))
        rows.append(("gdn prefill state (fla)", _err(states[pages], torch.stack(finals))))
    # conv: decode then prefill
    weight = torch.randn(cc, kernel, device="cuda", generator=gen).bfloat16() * 0.3
    conv = _pages(80, (cc, kernel - 1), torch.bfloat16, pad=1024)
    pages = torch.arange(1, 65, device="cuda")
    x = torch.randn(64, cc, device="cuda", generator=gen).bfloat16()
    before = conv[pages].clone()
    out = causal_conv_decode(x, weight, conv, pages)
    want = [
        causal_conv1d(x[i : i + 1].float(), weight.float(), before[i].float()) for i in range(64)
    ]
    rows.append(("conv decode out", _err(out, torch.cat([w[0] for w in want]))))
    rows.append(("conv decode state", _err(conv[pages], torch.stack([w[1] for w in want]))))
    x = torch.randn(sum(lengths), cc, device="cuda", generator=gen).bfloat16()
    pages = torch.tensor([3, 9, 1, 50, 7], device="cuda")
    before = conv[pages].clone()
    out = causal_conv_prefill(x, weight, conv, pages, cu.to(torch.int32))
    want = [
        causal_conv1d(x[int(cu[i]) : int(cu[i + 1])].float(), weight.float(), before[i].float())
        for i in range(len(lengths))
    ]
    rows.append(("conv prefill out", _err(out, torch.cat([w[0] for w in want]))))
    rows.append(("conv prefill state", _err(conv[pages], torch.stack([w[1] for w in want]))))
    return rows


def token_checks() -> list[tuple[str, str]]:
    prompts = [[(37 * i + 11 * j) % 151_000 for i in range(20 + 17 * j)] for j in range(8)]
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    rows, first = [], None
    base = EngineConfig(
        model="tiny-hybrid", device="cuda", activation_reserve=0, max_num_batched_tokens=64,
        loading_buffer_slots=16, fixed_expert_share=0.9,
    )  # fmt: skip
    probe = Engine(base, log_plan=False)
    mc, g, plan = probe.model_config, probe.geometry, probe.plan
    # what is not the pool (weights, CUDA graphs, loading buffers), every expert and 1 MiB
    # for KV and states: pages run short
    experts = mc.num_moe_layers * mc.num_experts * 3 * g.expert_page_bytes
    budget = plan.budget_bytes - plan.pool_bytes + experts + 2**20
    del probe
    runs = [(m, k, False) for m in ("resident", "fixed", "elastic") for k in (True, False)]
    runs += [(m, True, True) for m in ("resident", "elastic")]  # async scheduling, kernels
    for mode, kernels, scheduled_async in runs:
        config = replace(
            base, use_kernels=kernels, memory_budget=budget, async_scheduling=scheduled_async,
            tunables=Tunables(mode=mode, expert_offload_limit=12),
        )  # fmt: skip
        engine = Engine(config, log_plan=False)
        tokens = engine.generate(prompts, params)
        engine.check_invariants()
        first = first or tokens
        same = sum(a == b for a, b in zip(tokens, first, strict=True))
        c = engine.experts.counters
        rows.append((
            f"tiny-hybrid {mode} {'triton' if kernels else 'torch'}"
            + " async" * scheduled_async,
            f"{same}/{len(prompts)} sequences equal; preemptions "
            f"{engine.scheduler.num_preemptions}, evictions {c.evictions}, copies "
            f"{c.buffer_copies}, leaked {engine.num_leaked_pages()}",
        ))  # fmt: skip
        del engine
        torch.cuda.empty_cache()
    return rows


def _bench(out: Path, argv: list[str]) -> dict:
    base = ["bench", "--model", MODEL, "--device", "cuda", "--trace", "sharegpt_qwen_1000",
            "--request-rate", "inf", "--output-dir", str(out), "--no-progress"]  # fmt: skip
    start = time.monotonic()
    code = rimuru_main(base + argv)
    torch.cuda.empty_cache()
    if code != 0:
        raise RuntimeError(f"rimuru bench exited {code}")
    results = json.loads((out / "results.json").read_text())
    return {"seconds": time.monotonic() - start, "results": results}


def full_memory(out: Path) -> list[tuple[str, str]]:
    run = _bench(out / "full", ["--policies", "resident", "--num-prompts", "1000",
                                "--gpu-memory-utilization", "0.9", "--max-num-seqs", "512"])  # fmt: skip
    return [("full memory resident", json.dumps(run["results"])[:2000])]


def just_fits(out: Path) -> list[tuple[str, str]]:
    mc = preset_config(MODEL)
    weights = non_pool_weight_bytes(mc, torch.bfloat16, 0.0) + (
        mc.num_moe_layers * mc.num_experts * 3 * mc.moe_intermediate_size * mc.hidden_size * 2
    )
    budget = weights + 4 * GiB
    run = _bench(out / "just_fits", ["--policies", "resident,elastic", "--num-prompts", "300",
                                     "--memory-budget", str(budget), "--max-num-seqs", "512",
                                     "--expert-offload-limit", "32"])  # fmt: skip
    return [(f"weights {weights / GiB:.2f} GiB + 4 GiB", json.dumps(run["results"])[:3000])]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=["checks", "full-memory", "just-fits"])
    p.add_argument("--out", default="out/hybrid_gpu")
    args = p.parse_args()
    faulthandler.dump_traceback_later(540, exit=False)  # where a call that runs long stands
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    steps = {
        "checks": [kernel_checks, token_checks],
        "full-memory": [lambda: full_memory(out)],
        "just-fits": [lambda: just_fits(out)],
    }[args.what]
    rows, failed = [], False
    for step in steps:
        try:
            rows += step()
        except Exception:  # report and go on: one call should say as much as it can
            traceback.print_exc()
            rows.append((getattr(step, "__name__", "step"), "FAILED (traceback above)"))
            failed = True
    (out / f"{args.what}.json").write_text(json.dumps(rows, indent=1))
    width = max(len(r[0]) for r in rows)
    print(f"\n{'check'.ljust(width)}  result")
    for name, result in rows:
        print(f"{name.ljust(width)}  {result}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
