"""Checks of the code paths that only run on CUDA, in one short run: run it first on a GPU,
before long benchmarks, so a GPU-only bug costs a minute, not a run.

    python3 bench/gpu_checks.py [--out DIR]                                        # CUDA
    TRITON_INTERPRET=1 python bench/gpu_checks.py --device cpu [--only one-block]  # CPU

1. one-block requests: a 5-token prompt alone, Triton kernels, every policy (block tables
   of shape [L, 1, 1]; a Fig. 4 run on the GPU once stopped on exactly this).
2. Triton path == torch path: greedy tokens of the fp32 `tiny` preset under the three
   policies with kernels and without (fp32 dots must be exact, not tf32).
3. no host synchronisation in a fully resident engine's step but its one wait for the tokens
   (greedy and seeded sampling): torch.cuda.set_sync_debug_mode("warn"), counted per step
   (CUDA only).
4. the activation reserve: measured by the profiling forward vs the CPU estimate (CUDA only).
5. an engine on cuda:1 when there are two GPUs (Triton launches on the current device).
6. no kernel compiled mid-serving: after the start-up warm-up, varied batches make Triton
   compile nothing (CUDA only).
7. CUDA graphs == eager: the fp32 `tiny` preset, resident and a tight elastic, greedy tokens
   and rows routed per layer with decode graphs replayed and with --enforce-eager; expert
   choices that differ by rounding are counted, not failed (a padded graph step may pick
   other tiles and splits than the eager step: same math, other bf16/fp32 rounding)
   (CUDA only).
   Resident must also have replayed piecewise graphs for its prompt steps (host-copy
   elastic has none: piecewise_graphs.py).
8. device copy-in == host copies: fixed and a tight elastic with expert_copy="device" (a
   kernel reads pinned host memory; graphs replay with experts offloaded) give the eager
   host-copy tokens, prompt steps replayed as piecewise graphs (CUDA only; the pool is
   sized so that both policies really copy).
9. padded KV pages: a checkpoint whose KV page does not divide its expert page (KV slots
   padded, the kernels step pages by the slot) gives the CPU torch path's greedy tokens,
   resident and a tight elastic that evicts (CUDA only).
10. async scheduling == synchronous: greedy and seeded sampling; resident in a roomy pool
   (decode and piecewise graphs replayed, their decodes' tokens taken on the device) and a
   tight one (preemptions), elastic with device copy-in evicting: the same tokens, no page
   leaked (CUDA only).
11. hybrid Triton path == torch path: greedy tokens of the fp32 `tiny-hybrid` preset (Gated
   DeltaNet's states in pool pages) under the three policies in a pool that runs short, and
   resident and elastic with async scheduling: the same tokens, no page leaked (CUDA only:
   the presets' random weights differ between CPU and CUDA generators).
Prints a table last: check, result, detail. Exit status 1 if any check failed.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import traceback
import warnings
from dataclasses import replace
from pathlib import Path

import torch

from rimuru.dataplane.engine.engine import Engine
from rimuru.dataplane.engine.graphs.piecewise_graphs import graph_driver_bytes
from rimuru.dataplane.engine.sched.request import SamplingParams
from rimuru.dataplane.engine.startup.budget import estimate_activation_bytes
from rimuru.dataplane.engine.startup.config import EngineConfig
from rimuru.dataplane.model.checkpoint import PRESETS
from rimuru.policy import MODES, Tunables

MiB = 2**20
PARAMS = SamplingParams(max_tokens=6, ignore_eos=True)


def engine(device: str, mode: str, kernels: bool, **overrides) -> Engine:
    config = EngineConfig(
        device=device,
        activation_reserve=0,
        max_num_batched_tokens=128,
        memory_budget=200 * MiB,
        loading_buffer_slots=32,
        fixed_expert_share=0.05,  # few experts cached: the fixed path copies on every layer
        use_kernels=kernels,
        # the paper's rule: it evicts whenever KV runs short, which these checks need; the
        # cost rule may rightly find that an eviction does not pay at their sizes
        tunables=Tunables(mode=mode, expert_offload_limit=16, elastic_rule="paper"),
        # host copies unless a check asks for device copy-in: check 8 compares the two, and
        # check 7 covers the host path's graphs (eager whenever experts are offloaded)
        expert_copy="host",
        # warm-up compiles each batch shape's kernels on a GPU; under the CPU's interpreter
        # it would only run them all once more (warm-up has its own test)
        warmup=not device.startswith("cpu"),
        async_scheduling=False,  # but check 10: auto differs between device and host copies
    )
    return Engine(replace(config, **overrides), log_plan=False)


def graph_driver_allowance() -> int:
    """What the graph plan sets aside for the driver (priced per graph: cuda_graphs.py),
    decode and piecewise graphs, added to the budgets these checks are sized with, so their
    pools stay the size the checks need whatever the driver's price (a probe engine's plan,
    measured at start-up, varies by tens of MiB between engines of one process)."""
    decode, pieces = graph_driver_bytes(
        PRESETS["tiny"].num_layers, EngineConfig().max_num_seqs, 128
    )
    return int(1.1 * (decode + pieces))


def prompts(n: int) -> list[list[int]]:
    rng = random.Random(3)
    return [[rng.randrange(151_000) for _ in range(rng.randint(17, 70))] for _ in range(n)]


def one_block(device: str) -> str:
    first = None
    for mode in MODES:
        e = engine(device, mode, kernels=True)
        tokens = e.generate([prompts(1)[0][:5]], PARAMS)
        e.check_invariants()
        first = first or tokens
        if tokens != first:
            raise AssertionError(f"{mode} gave {tokens}, resident {first}")
    return f"3 policies, tokens {first[0]}"


def paths_agree(device: str) -> str:
    runs = {
        (m, k): engine(device, m, k).generate(prompts(6), PARAMS)
        for m in MODES
        for k in (True, False)
    }
    reference = runs[("resident", False)]
    differ = [f"{m}/{'triton' if k else 'torch'}" for (m, k), t in runs.items() if t != reference]
    if differ:
        raise AssertionError(f"tokens differ from resident/torch: {differ}")
    return "6 runs, 36 tokens, all identical"


def no_sync(device: str) -> str:
    """Every step synchronises with the device at most once (its wait for the tokens), greedy
    and seeded sampling alike: torch.cuda's sync debug mode warns at each synchronising call,
    and the warnings are counted per step."""
    e = engine(device, "resident", kernels=True, enforce_eager=True)  # the eager forward
    sampled = SamplingParams(max_tokens=6, ignore_eos=True, temperature=0.8, seed=1)
    e.generate(prompts(2), PARAMS)  # compile everything first
    e.generate(prompts(2), sampled)
    for i, p in enumerate(prompts(4)):
        e.add_request(p, PARAMS if i % 2 else sampled)
    most, steps = 0, 0
    torch.cuda.set_sync_debug_mode("warn")
    try:
        while e.has_unfinished_requests():
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                e.step()
            syncs = [w for w in caught if "synchroniz" in str(w.message)]
            most, steps = max(most, len(syncs)), steps + 1
    finally:
        torch.cuda.set_sync_debug_mode(0)
    if most > 1:
        raise AssertionError(f"a step synchronised {most} times (at most its one wait)")
    return f"{steps} steps of greedy and sampled requests: at most {most} sync a step"


def reserve(device: str) -> str:
    e = engine(device, "resident", kernels=True, activation_reserve=None, memory_budget=400 * MiB)
    estimate = estimate_activation_bytes(e.model_config, 128, 256, e.dtype)
    return (
        f"measured {e.plan.activation_reserve_bytes / MiB:.1f} MiB (incl. 10% headroom), "
        f"estimate {estimate / MiB:.1f} MiB"
    )


def second_gpu(device: str) -> str:
    e = engine("cuda:1", "elastic", kernels=True)
    tokens = e.generate(prompts(2), PARAMS)
    same = engine("cuda:0", "elastic", kernels=True).generate(prompts(2), PARAMS)
    if tokens != same:
        raise AssertionError("cuda:1 and cuda:0 disagree")
    return "cuda:1 tokens == cuda:0 tokens"


def serve_and_count_compiles(device: str) -> tuple[int, list[str]]:
    """Build an engine (its warm-up compiles), then serve varied batches: returns how many
    variants the warm-up compiled and which ones serving compiled after it. Run in a fresh
    process (no_compile_mid_serving), where no earlier engine has filled Triton's caches."""
    import triton

    compiled: list[str] = []
    previous = triton.knobs.runtime.jit_post_compile_hook

    def hook(**kwargs) -> None:  # Triton passes key, repr, fn, compile, ...
        compiled.append(str(kwargs.get("repr", "?"))[:400])

    triton.knobs.runtime.jit_post_compile_hook = hook
    try:
        e = engine(device, "elastic", kernels=True, max_num_seqs=64, memory_budget=400 * MiB)
        at_start = len(compiled)
        rng = random.Random(5)
        # batch sizes 1..64, prompts up to 700 tokens (split decodes), varied outputs
        for n, longest in ((1, 700), (3, 300), (5, 520), (20, 70), (64, 40)):
            batch = [[rng.randrange(151_000) for _ in range(rng.randint(5, longest))]
                     for _ in range(n)]  # fmt: skip
            # the odd-sized batches sampled: the sampler's kernel must not compile mid-serving
            temperature = 0.7 if n % 2 else 0.0
            e.generate(batch, SamplingParams(max_tokens=rng.randint(2, 40), ignore_eos=True,
                                             temperature=temperature, seed=n))  # fmt: skip
    finally:
        triton.knobs.runtime.jit_post_compile_hook = previous
    return at_start, compiled[at_start:]


def no_compile_mid_serving(device: str) -> str:
    here = str(Path(__file__).parent)
    code = (
        f"import json, sys; sys.path.insert(0, {here!r}); import gpu_checks; "
        f"print(json.dumps(gpu_checks.serve_and_count_compiles({device!r})))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-1500:])
    at_start, serving = json.loads(done.stdout.strip().splitlines()[-1])
    if at_start == 0:
        raise AssertionError("the warm-up compiled nothing: the check saw warm caches")
    if serving:
        raise AssertionError(f"{len(serving)} variants compiled while serving: {serving[:6]}")
    return f"warm-up compiled {at_start} variants; serving 93 requests compiled 0"


def graphs_match_eager(device: str) -> str:
    details = []
    eager = engine(device, "resident", kernels=True, enforce_eager=True)
    not_pool = eager.plan.budget_bytes - eager.plan.pool_bytes
    for mode in ("resident", "elastic"):
        budget = 200 * MiB + graph_driver_allowance()
        batch, params = prompts(12), SamplingParams(max_tokens=16, ignore_eos=True)
        if mode == "elastic":
            # a pool of 25 MiB (experts take 24): 20 requests make it evict and load back
            # what its graphs plan (host copies: decode graphs only, which a 200 MiB
            # budget holds beside every expert)
            probe = engine(device, mode, kernels=True)
            budget = not_pool + 25 * MiB + probe.plan.cuda_graph_bytes
            batch, params = prompts(20), SamplingParams(max_tokens=32, ignore_eos=True)
        g = engine(device, mode, kernels=True, memory_budget=budget)
        graph_bytes = g.plan.cuda_graph_bytes
        # the eager twin gets the very same pool: the same schedule
        e = engine(device, mode, kernels=True, enforce_eager=True,
                   memory_budget=g.plan.budget_bytes - graph_bytes)  # fmt: skip
        if e.plan.pool_bytes != g.plan.pool_bytes:
            raise AssertionError(
                f"{mode}: pools differ ({e.plan.pool_bytes} vs {g.plan.pool_bytes})"
            )
        got, want = g.generate(batch, params), e.generate(batch, params)
        got_counts, want_counts = g.moe_backend.routing_counts, e.moe_backend.routing_counts
        for x in (g, e):
            x.check_invariants()
            if x.num_leaked_pages():
                raise AssertionError(f"{mode}: {x.num_leaked_pages()} KV pages leaked")
        if g.cuda_graphs.decode is None or g.cuda_graphs.decode.replays == 0:
            raise AssertionError(f"{mode}: no graph was replayed")
        pieces = g.cuda_graphs.piecewise.replays if g.cuda_graphs.piecewise is not None else 0
        if mode == "resident" and not pieces:
            raise AssertionError(f"{mode}: no prompt step replayed piecewise graphs")
        if got != want:
            raise AssertionError(f"{mode}: graph tokens differ from eager")
        # Unless a preemption recomputed tokens in one of them (the graph engine's L padding
        # pages leave it that much less KV), every layer routed the same number of rows: a
        # counted padding row would add to it. Which expert a row picks may still differ by
        # a router near-tie, since a padded step rounds otherwise (cuBLAS picks by batch
        # size, decode attention splits otherwise); the tokens must still be identical.
        recomputed = g.scheduler.num_preemptions + e.scheduler.num_preemptions
        if not recomputed and not torch.equal(got_counts.sum(1), want_counts.sum(1)):
            raise AssertionError(f"{mode}: rows routed per layer differ (padding counted?)")
        flips = int((got_counts - want_counts).abs().sum()) // 2
        if not recomputed and flips > max(2, int(want_counts.sum()) // 1000):
            raise AssertionError(f"{mode}: {flips} expert choices differ, more than rounding")
        details.append(
            f"{mode} {g.cuda_graphs.decode.replays} + {pieces} piecewise of {g.stats[-1].step} steps replayed, "
            f"{g.expert_counters.evictions} evictions, {g.expert_counters.loads} loads, "
            f"{recomputed} preemptions, {flips} of {int(want_counts.sum())} expert choices "
            f"differ, graphs {g.plan.cuda_graph_bytes / MiB:.1f} MiB planned, "
            f"{_held(g.cuda_graphs.decode, g.cuda_graphs.piecewise)}"
        )
    return "; ".join(details) + "; tokens identical"


def _held(*graphs) -> str:
    """What the captured graphs hold per torch's allocator, and how far the device's free
    memory fell (which also counts the driver's memory per graph)."""
    held = sum(g.cost.held_bytes for g in graphs if g is not None) / MiB
    fell = sum(g.cost.free_drop_bytes for g in graphs if g is not None) / MiB
    return f"{held:.1f} MiB held, device free memory fell {fell:.1f} MiB"


def device_copy_matches_host(device: str) -> str:
    details = []
    for mode in ("fixed", "elastic"):
        batch, params = prompts(20), SamplingParams(max_tokens=32, ignore_eos=True)
        budget = 200 * MiB + graph_driver_allowance()
        if mode == "elastic":
            # A 24 MiB pool, the tiny preset's experts alone: KV must come from evictions,
            # and evicted experts are routed again. Sized from the device-mode plan itself
            # (one loading buffer, graphs, weights): a budget sized from the resident plan
            # left this pool a few MiB larger, and it never copied.
            probe = engine(device, mode, kernels=True, expert_copy="device", memory_budget=budget)
            budget = probe.plan.budget_bytes - probe.plan.pool_bytes + 24 * MiB
        d = engine(device, mode, kernels=True, expert_copy="device", memory_budget=budget)
        offloaded_replays = []
        if d.cuda_graphs.decode is not None:
            run = d.cuda_graphs.decode.run

            def observed(*args, d=d, run=run, seen=offloaded_replays):
                seen.append(not d.residency.fully_resident())
                return run(*args)

            d.cuda_graphs.decode.run = observed
        got = d.generate(batch, params)
        want = engine(device, mode, kernels=True, enforce_eager=True).generate(batch, params)
        d.check_invariants()
        if got != want:
            raise AssertionError(f"{mode}: device copy-in tokens differ from host copies")
        if not d.expert_counters.buffer_copies:
            raise AssertionError(f"{mode}: nothing was copied in")
        if d.cuda_graphs.decode is None or not any(offloaded_replays):
            raise AssertionError(f"{mode}: no graph replayed with experts offloaded")
        if d.cuda_graphs.piecewise is None or not d.cuda_graphs.piecewise.replays:
            raise AssertionError(f"{mode}: no prompt step replayed piecewise graphs")
        details.append(
            f"{mode} {sum(offloaded_replays)} offloaded steps replayed, "
            f"{d.cuda_graphs.piecewise.replays} piecewise, "
            f"{d.expert_counters.buffer_copies} copies, {d.expert_counters.evictions} evictions"
        )
    return "; ".join(details) + "; tokens identical"


def _padded_kv_checkpoint(path: Path) -> None:
    """A tiny fp32 Qwen2-MoE: expert page 40 x 64 x 4 = 10,240 B; KV page 2 x 16 x 2 x 16 x 4
    = 4,096 B does not divide it, so KV pages sit in 5,120 B slots."""
    import transformers

    torch.manual_seed(5)
    config = transformers.Qwen2MoeConfig(
        vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.15,
        moe_intermediate_size=40, shared_expert_intermediate_size=64, num_experts=8,
        num_experts_per_tok=2, eos_token_id=None,
    )  # fmt: skip
    transformers.Qwen2MoeForCausalLM(config).eval().save_pretrained(path)


def padded_kv_pages(device: str) -> str:
    import tempfile

    from rimuru.dataplane.engine.startup.setup import loading_buffer_bytes
    from rimuru.dataplane.memory.geometry import PageType

    with tempfile.TemporaryDirectory() as tmp:
        _padded_kv_checkpoint(Path(tmp))
        asks = [[(5 * i + 11 * j) % 256 for j in range(18 + 13 * i)] for i in range(5)]
        params = SamplingParams(max_tokens=8, ignore_eos=True)

        def run(dev: str, mode: str, kernels: bool, kv_blocks: int | None) -> Engine:
            config = EngineConfig(
                model=tmp, device=dev, activation_reserve=0, max_num_batched_tokens=128,
                loading_buffer_slots=8, use_kernels=kernels, enforce_eager=True,
                tunables=Tunables(mode=mode, expert_offload_limit=6, elastic_rule="paper"),
            )  # fmt: skip  # eager: the budget below is exact (graphs are check 7's)
            if kv_blocks is not None:  # every expert + this many blocks of KV: evictions
                probe = Engine(replace(config, device="cpu", use_kernels=False), log_plan=False)
                g, mc = probe.geometry, probe.model_config
                budget = (
                    probe.model.resident_nbytes() + loading_buffer_bytes(config, 8, g)
                    + mc.num_moe_layers * mc.num_experts * 3 * g.expert_page_bytes
                    + kv_blocks * mc.num_layers * g.kv_page_bytes
                )  # fmt: skip
                config = replace(config, memory_budget=budget)
            return Engine(config, log_plan=False)

        reference = run("cpu", "resident", False, None).generate(asks, params)
        details = []
        for mode, kv_blocks in (("resident", None), ("elastic", 4)):
            e = run(device, mode, True, kv_blocks)
            slot = e.pool.view(PageType.KV).stride(0) * 4
            tokens = e.generate(asks, params)
            e.check_invariants()
            if tokens != reference:
                raise AssertionError(f"{mode}: {tokens} differ from the torch path's {reference}")
            if kv_blocks is not None and not e.expert_counters.evictions:
                raise AssertionError(f"{mode} evicted nothing: the pool is not tight")
            details.append(f"{mode} {e.expert_counters.evictions} evictions")
        return f"KV slot {slot} B for 4096 B pages; " + ", ".join(details) + "; tokens identical"


def budget_for_pool(device: str, policy: str, pool: int, **overrides) -> int:
    """A budget whose eager engine's pool is `pool` bytes (no graphs: their planned memory
    varies between engines of one process, and so would the pool)."""
    plan = engine(device, policy, kernels=True, enforce_eager=True, **overrides).plan
    return plan.budget_bytes - plan.pool_bytes + pool


def async_matches_sync(device: str) -> str:
    """Resident in a roomy pool (decode and piecewise graphs: mixed steps take their decodes'
    tokens in the pieces' inputs) and a tight one (preemptions); elastic with device copy-in
    in a pool of its experts alone (evictions inside rounds, pages reused in stream order)."""
    roomy = 200 * MiB + graph_driver_allowance()
    tight = budget_for_pool(device, "resident", 26 * MiB)  # eager; the experts take 24 MiB
    evicting = budget_for_pool(device, "elastic", 24 * MiB, expert_copy="device")
    batch = prompts(40)
    details = []
    cases = (
        ("resident roomy", "resident", roomy, {}),
        ("resident tight", "resident", tight, {"enforce_eager": True}),
        ("elastic tight", "elastic", evicting, {"expert_copy": "device", "enforce_eager": True}),
    )
    for name, policy, budget, extra in cases:
        for params in (
            SamplingParams(max_tokens=32, ignore_eos=True),
            SamplingParams(max_tokens=32, ignore_eos=True, temperature=0.8, seed=7),
        ):
            runs = {}
            for mode in (False, True):
                e = engine(device, policy, kernels=True, memory_budget=budget,
                           async_scheduling=mode, **extra)  # fmt: skip
                runs[mode] = (e.generate(batch, params), e)
                e.check_invariants()
                if e.num_leaked_pages():
                    raise AssertionError(f"{name} async={mode}: {e.num_leaked_pages()} leaked")
            (want, s), (got, a) = runs[False], runs[True]
            if got != want:
                differ = sum(x != y for x, y in zip(got, want, strict=True))
                raise AssertionError(f"{name}: {differ} of {len(want)} requests differ")
            graphs = a.cuda_graphs
            decode = graphs.decode.replays if graphs.decode is not None else 0
            pieces = graphs.piecewise.replays if graphs.piecewise is not None else 0
            if name == "resident roomy" and not (decode and pieces):  # tight pools may plan none
                raise AssertionError(f"{name}: async replayed {decode} decode, {pieces} piecewise")
            if name == "resident tight" and not s.scheduler.num_preemptions:
                raise AssertionError(
                    f"{name}: a {a.plan.pool_bytes / MiB:.1f} MiB pool never preempted"
                )
            if policy == "elastic" and not a.expert_counters.evictions:
                raise AssertionError(f"{name}: async evicted nothing")
            kind = "sampled" if params.temperature else "greedy"
            details.append(
                f"{name} ({a.plan.pool_bytes / MiB:.0f} MiB pool) {kind}: {decode} + {pieces} piecewise replays, preemptions "
                f"{s.scheduler.num_preemptions} / {a.scheduler.num_preemptions}, evictions "
                f"{s.expert_counters.evictions} / {a.expert_counters.evictions} (sync / async)"
            )
    return "; ".join(details) + "; tokens identical"


def hybrid_paths_agree(device: str) -> str:
    """The fp32 `tiny-hybrid` preset (Gated DeltaNet + attention + MoE) gives the same greedy
    tokens under resident, fixed and a tight elastic, with the Triton kernels and with the
    torch path, synchronously, and resident and elastic with async scheduling (kernels)."""
    batch = [[(37 * i + 11 * j) % 151_000 for i in range(20 + 17 * j)] for j in range(8)]
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    base = EngineConfig(
        model="tiny-hybrid", device=device, activation_reserve=0, max_num_batched_tokens=64,
        loading_buffer_slots=16, fixed_expert_share=0.9, async_scheduling=False,
    )  # fmt: skip
    probe = Engine(base, log_plan=False)
    mc, g, plan = probe.model_config, probe.geometry, probe.plan
    # what is not the pool (weights, CUDA graphs, loading buffers), every expert and 1 MiB
    # for KV and states: pages run short
    experts = mc.num_moe_layers * mc.num_experts * 3 * g.expert_page_bytes
    budget = plan.budget_bytes - plan.pool_bytes + experts + MiB
    del probe
    runs = [(m, k, False) for m in MODES for k in (True, False)]
    runs += [(m, True, True) for m in ("resident", "elastic")]
    first, details = None, []
    for mode, kernels, scheduled_async in runs:
        config = replace(
            base, use_kernels=kernels, memory_budget=budget, async_scheduling=scheduled_async,
            tunables=Tunables(mode=mode, expert_offload_limit=12),
        )  # fmt: skip
        e = Engine(config, log_plan=False)
        tokens = e.generate(batch, params)
        e.check_invariants()
        name = f"{mode}/{'triton' if kernels else 'torch'}" + "/async" * scheduled_async
        first = first or tokens
        if tokens != first or e.num_leaked_pages():
            differ = sum(a != b for a, b in zip(tokens, first, strict=True))
            raise AssertionError(f"{name}: {differ} of {len(batch)} sequences differ from "
                                 f"resident/triton, {e.num_leaked_pages()} pages leaked")  # fmt: skip
        c = e.expert_counters
        details.append(f"{name} {e.scheduler.num_preemptions}p {c.evictions}e {c.buffer_copies}c")
    return f"{len(runs)} runs, tokens identical (preemptions, evictions, copies): " + ", ".join(
        details
    )


CHECKS = {
    "one-block": ("one-block requests", one_block),
    "paths": ("triton == torch tokens", paths_agree),
    "sync": ("no host sync (resident)", no_sync),
    "reserve": ("activation reserve", reserve),
    "gpu1": ("second GPU", second_gpu),
    "compile": ("no compile mid-serving", no_compile_mid_serving),
    "graphs": ("CUDA graphs == eager", graphs_match_eager),
    "device-copy": ("device copy == host copy", device_copy_matches_host),
    "padded-kv": ("padded KV pages", padded_kv_pages),
    "async": ("async == sync scheduling", async_matches_sync),
    "hybrid": ("hybrid: triton == torch tokens", hybrid_paths_agree),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default=None, help="also write gpu_checks.json here")
    ap.add_argument("--only", default=None, help=f"comma list of {', '.join(CHECKS)}")
    args = ap.parse_args()
    cuda = args.device.startswith("cuda")
    names = args.only.split(",") if args.only else list(CHECKS)
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        ap.error(f"unknown checks {unknown}: choose from {', '.join(CHECKS)}")
    # the rest need CUDA (the interpreter compiles nothing, captures no graph)
    wanted = {name: cuda for name in CHECKS} | {"one-block": True, "paths": True}
    wanted["gpu1"] = cuda and torch.cuda.device_count() > 1
    checks = [CHECKS[n] for n in names if wanted[n]]
    rows = []
    for name, check in checks:
        try:
            rows.append((name, "ok", check(args.device)))
        except Exception as exc:  # report every check, not just the first failure
            traceback.print_exc()
            rows.append((name, "FAILED", repr(exc)[:200]))
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "gpu_checks.json").write_text(json.dumps(rows, indent=1))
    if not rows:
        print("no checks ran: the ones asked for need CUDA (or a second GPU)")
        return 0
    width = max(len(r[0]) for r in rows)
    for name, result, detail in rows:
        print(f"{name.ljust(width)}  {result:6s}  {detail}")
    return 1 if any(r[1] != "ok" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
