"""Tune the fused MoE's block configurations on this GPU and write the table kernels/configs/ reads.

Usage (GPU):  python bench/tune_moe.py [--models all] [--tokens 1,2,...,4096] [--out FILE]

For every model shape and token count it times, with triton.testing.do_bench (median of
CUDA-graph replays, L2 flushed before each), gemm1 and gemm2 of the *paged* kernel apart for each candidate
tile, keeps the fastest tile of each GEMM per block_m, then the block_m whose two GEMMs
together are fastest. The contiguous twin runs with the same table, which keeps the
paged-vs-contiguous comparison like for like. Candidates are compiled first in parallel
worker processes (Triton's on-disk cache is shared), so the timing loop compiles nothing.

The model shapes, expert fixtures and timers it shares with bench/kernels_gpu.py live in
rimuru.kernels.moe_bench.
"""

import argparse
import concurrent.futures as cf
import datetime
import json
import multiprocessing
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, astuple, replace
from pathlib import Path

import torch

from rimuru.kernels.moe_align import moe_align_block_size
from rimuru.kernels.moe_bench import (
    MODELS,
    TOKEN_COUNTS,
    MoeShape,
    PagedExperts,
    make_experts,
    model_names,
    random_routing,
    replay_ms,
    run_info,
)
from rimuru.kernels.moe_configs import (
    CONFIG_DIR,
    SCHEDULES,
    GemmTile,
    MoeConfig,
    config_file_name,
    shape_key,
)
from rimuru.kernels.moe_gemm import launch_down_gemm, launch_up_gemm

# Shape key: E = experts, I = expert intermediate, D = hidden, K = top-k, T = tokens.

_SMALL_TILES = [  # (block_n, block_k, num_warps, num_stages): weight streaming, few rows
    (64, 128, 4, 4),
    (128, 128, 4, 3),
    (64, 256, 4, 3),
    (32, 256, 4, 4),
    (128, 64, 4, 4),
    (64, 64, 4, 5),
    # deeper pipelines and wider programs: more bytes in flight per SM while rows are few
    (32, 128, 4, 6),
    (64, 128, 4, 6),
    (64, 128, 8, 5),
    (128, 128, 8, 4),
    (128, 64, 4, 6),
    (256, 64, 8, 4),
    (64, 256, 8, 4),
    (32, 512, 4, 3),
]
# Tensor-core bound tiles. The up GEMM keeps two accumulators (gate and up), so its
# tiles are half as wide as the down GEMM's. The last four of each list fit two or more
# programs on one SM at block_m = 128 (shared memory <= ~100 KB, accumulators <= 128
# registers a thread): while one program stores its tile, another keeps the tensor cores
# busy. Most earlier tiles hold the SM alone (up to 196 KB of shared memory).
_LARGE_UP_TILES = [
    (64, 64, 4, 4),
    (128, 64, 4, 3),
    (128, 64, 8, 3),
    (128, 64, 8, 4),
    (64, 128, 4, 3),
    (64, 64, 8, 5),
    (64, 64, 8, 3),
    (64, 64, 4, 3),
    (32, 64, 4, 4),
    (64, 32, 4, 4),
]
_LARGE_DOWN_TILES = [
    (64, 64, 4, 4),
    (128, 64, 4, 3),
    (128, 64, 8, 4),
    (256, 64, 8, 3),
    (128, 128, 8, 3),
    (64, 128, 4, 3),
    (128, 64, 8, 3),
    (128, 32, 4, 4),
    (128, 64, 4, 2),
    (64, 64, 4, 3),
]


def block_ms_for(num_tokens: int, shape: MoeShape) -> list[int]:
    rows = num_tokens * shape.top_k / shape.num_experts  # mean rows per expert
    ms = [
        bm
        for bm, lo, hi in ((16, 0, 64), (32, 8, 256), (64, 16, 1e9), (128, 64, 1e9))
        if lo < rows <= hi
    ]
    return ms or [16]


def tiles_for(block_m: int, up: bool) -> list[GemmTile]:
    if block_m <= 32:
        return [GemmTile(n, k, 1, w, s) for n, k, w, s in _SMALL_TILES]
    # block_m = 256 (one block per expert at ~128-256 pairs, 256-row tiles) is not offered:
    # tuned, its best tile was slower than block_m = 128's for every GEMM at 1024-4096 tokens;
    # offer it again only when a tuner run on the card shows otherwise.
    shapes = _LARGE_UP_TILES if up else _LARGE_DOWN_TILES
    # Tensor-core tiles both ways: pointer loads and TMA descriptors (moe_gemm.py), each
    # with and without tail tiles (an expert's last block computes 1/2 or 1/4 of its rows),
    # one tile a program; and persistent programs (moe_configs.SCHEDULES): with tails, or
    # flattened (which a tail's branch would undo). The up GEMM also with x's rows sorted
    # first (presort), read through TMA.
    tiles = [
        GemmTile(n, k, 8, w, s, tma, tail, schedule)
        for n, k, w, s in shapes
        for tma in (False, True)
        for tail, schedule in ((0, "grid"), (2, "grid"), (2, "persistent"), (0, "flattened"))
    ]
    if up:
        tiles += [
            GemmTile(n, k, 8, w, s, True, tail, schedule, presort=True)
            for n, k, w, s in shapes
            for tail, schedule in ((0, "grid"), (2, "grid"), (2, "persistent"))
        ]
    return tiles


def _bench(fn, rep_ms: float) -> float:
    try:
        return replay_ms(fn, rep_ms)
    except Exception as exc:  # out of shared memory or registers: not a candidate here
        print(f"    skipped: {type(exc).__name__}: {str(exc)[:120]}", file=sys.stderr)
        return float("inf")


def gemm_closures(
    experts: PagedExperts, shape: MoeShape, num_tokens: int, block_m: int, seed: int,
    skew: float = 0.0,
):  # fmt: skip
    """up(tile), down(tile): launchers of the paged GEMMs on random routing (tilted by
    ``skew``, moe_bench.random_routing); the tensors they write (act_out: the up GEMM's
    sorted rows; y: the down GEMM's pairs); the alignment."""
    device = experts.pool_pages.device
    ids, weights = random_routing(num_tokens, shape, device, seed, skew)
    x = torch.randn(num_tokens, shape.hidden_size, device=device).to(experts.pool_pages.dtype)
    align = moe_align_block_size(ids, shape.num_experts, block_m, experts.expert_table)
    P, inter = ids.numel(), shape.inter_size
    act = torch.randn(align.max_blocks * block_m, inter, device=device).to(x.dtype)  # sorted rows
    act_out = torch.zeros_like(act)  # rows a tail tile leaves unwritten stay 0, comparable
    y = torch.empty(P, shape.hidden_size, device=device, dtype=x.dtype)
    w = weights.reshape(-1).float()
    src = experts.paged_source()
    k = shape.top_k

    def up(tile):
        return lambda: launch_up_gemm(x, act_out, src, align, w, tile, inter_size=inter, top_k=k)

    def down(tile):
        return lambda: launch_down_gemm(act, y, src, align, w, tile, inter_size=inter, top_k=k)

    return up, down, act_out, y, align


def _all_block_configs(
    shapes: list[MoeShape], tokens: list[int], block_ms: list[int] | None
) -> list[tuple[int, GemmTile, bool]]:
    work = {
        (bm, tile, up)
        for s in shapes
        for n in tokens
        for bm in block_ms or block_ms_for(n, s)
        for up in (True, False)
        for tile in tiles_for(bm, up)
    }
    return sorted(work, key=lambda w: (w[0], w[2], *astuple(w[1])))


def _precompile_worker(args) -> int:
    """Run each (block_m, tile, gemm) once on small data of every shape: fills Triton's disk cache."""
    work, shapes, dtype_name = args
    dtype = getattr(torch, dtype_name)
    device = torch.device("cuda")
    done = 0
    for shape in shapes:
        small = MoeShape(shape.name, 4, shape.inter_size, shape.hidden_size, min(2, shape.top_k))
        experts = make_experts(small, dtype, device, seed=0, buffered_share=0.25)
        for bm, tile, is_up in work:
            up, down, *_ = gemm_closures(experts, small, 64, bm, seed=1)
            try:
                (up if is_up else down)(tile)()
                done += 1
            except Exception:
                pass
        torch.cuda.synchronize()
    return done


def precompile(
    shapes: list[MoeShape], tokens: list[int], block_ms: list[int] | None, dtype: torch.dtype,
    workers: int,
) -> None:  # fmt: skip
    configs = _all_block_configs(shapes, tokens, block_ms)
    chunks = [configs[i::workers] for i in range(workers)]
    ctx = multiprocessing.get_context("spawn")
    t0 = time.time()
    with cf.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        jobs = [(c, shapes, str(dtype).removeprefix("torch.")) for c in chunks if c]
        done = sum(pool.map(_precompile_worker, jobs))
    print(
        f"precompiled {done} kernels ({len(configs)} configs) in {time.time() - t0:.1f} s",
        flush=True,
    )


# Tile orders tried on each GEMM's best tile once it is chosen (not on every candidate: six
# times the list). Wide orders pay for Mixtral's few, large experts at 1024 tokens; the Qwen
# shapes' best orders stay near 8.
GROUP_MS = (1, 2, 4, 8, 16, 64)


def group_m_variants(tile: GemmTile) -> list[GemmTile]:
    """The tile at every other GROUP_MS tile order."""
    return [replace(tile, group_m=g) for g in GROUP_MS if g != tile.group_m]


def refine_group_m(
    times: dict[GemmTile, float], bench: Callable[[GemmTile], float]
) -> tuple[GemmTile, dict[GemmTile, float]]:
    """The best tile of ``times``, and its times (by ``bench``) at every other GROUP_MS order."""
    first = min(times, key=times.get)
    return first, {tile: bench(tile) for tile in group_m_variants(first)}


def variant_ratios(times: dict[GemmTile, float]) -> dict[str, float]:
    """One GEMM's candidates, same run: best with tail tiles / best without (one tile a
    program, gathered rows, both), best of each persistent schedule / best one tile a
    program (gathered rows, both), and best with presorted rows / best gathering them."""

    def best(keep) -> float:
        return min((t for tile, t in times.items() if keep(tile)), default=float("nan"))

    grid = best(lambda tile: tile.schedule == "grid" and not tile.presort)
    ratios = {
        "tail": best(lambda tile: tile.schedule == "grid" and not tile.presort and tile.tail)
        / best(lambda tile: tile.schedule == "grid" and not tile.presort and not tile.tail),
        "presort": best(lambda tile: tile.presort) / best(lambda tile: not tile.presort),
    }
    for schedule in SCHEDULES[1:]:
        ratios[schedule] = (
            best(lambda tile, s=schedule: tile.schedule == s and not tile.presort) / grid
        )
    return {name: r for name, r in ratios.items() if r == r}  # drop NaN: nothing to compare


def tune_shape(
    shape: MoeShape, tokens: list[int], dtype: torch.dtype, rep_ms: float, log: list[dict],
    *, skew: float = 0.0, block_ms: list[int] | None = None,
) -> dict:  # fmt: skip
    """The best config per token count; every candidate's time is appended to ``log``."""
    device = torch.device("cuda")
    experts = make_experts(shape, dtype, device, seed=0)
    table = {}
    for n in tokens:
        best = None
        for bm in block_ms or block_ms_for(n, shape):
            up, down, _, _, align = gemm_closures(experts, shape, n, bm, seed=n, skew=skew)
            routed = int(align.block_expert_ids.unique().ge(0).sum())
            t_up = {tile: _bench(up(tile), rep_ms) for tile in tiles_for(bm, up=True)}
            t_down = {tile: _bench(down(tile), rep_ms) for tile in tiles_for(bm, up=False)}
            for gemm, launch, times in (("up", up, t_up), ("down", down, t_down)):
                # Ratios first: refined orders would give one side of a ratio six tries.
                ratios = " ".join(f"{k} {r:.3f}" for k, r in variant_ratios(times).items())
                first, orders = refine_group_m(
                    times, lambda t, launch=launch: _bench(launch(t), rep_ms)
                )
                order = min(orders, key=orders.get)
                times.update(orders)
                log.extend({"model": shape.name, "tokens": n, "block_m": bm, "gemm": gemm,
                            "tile": asdict(tile), "ms": t} for tile, t in times.items())  # fmt: skip
                print(f"  {shape.name:18s} T={n:5d} bm={bm:3d} {gemm:4s} best of variant / "
                      f"baseline: {ratios}; group_m {order.group_m} / {first.group_m} "
                      f"{orders[order] / times[first]:.3f}", flush=True)  # fmt: skip
            tile1, tile2 = min(t_up, key=t_up.get), min(t_down, key=t_down.get)
            total = t_up[tile1] + t_down[tile2]
            if best is None or total < best[0]:
                best = (total, MoeConfig(bm, tile1, tile2), t_up[tile1], t_down[tile2], routed)
        total, config, t1, t2, routed = best
        # the weights each GEMM must read once: the routed experts' w1 and w3, then w2
        matrix = shape.inter_size * shape.hidden_size * experts.pool_pages.element_size()
        print(f"  {shape.name:18s} T={n:5d} bm={config.block_m:3d} gemm1 {t1 * 1e3:8.1f} us "
              f"{config.gemm1}  gemm2 {t2 * 1e3:8.1f} us {config.gemm2}; {routed} experts "
              f"routed: {2 * matrix * routed / t1 / 1e9:.2f} / {matrix * routed / t2 / 1e9:.2f} "
              f"TB/s", flush=True)  # fmt: skip
        table[str(n)] = config.to_json()
    del experts
    torch.cuda.empty_cache()
    return table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="all", help=f"comma list of {sorted(MODELS)} or 'all'")
    parser.add_argument("--tokens", default=",".join(map(str, TOKEN_COUNTS)))
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--rep-ms", type=float, default=10.0, help="do_bench repetition time")
    parser.add_argument("--workers", type=int, default=min(15, os.cpu_count() or 1))
    parser.add_argument("--out", type=Path, default=None, help="also copy the table here")
    parser.add_argument("--log", type=Path, default=None, help="every candidate's time, as JSON")
    parser.add_argument("--router-skew", type=float, default=0.0,
                        help="tilt the random routing as the presets do (1.0: the engine's "
                             "default): decode batches then route to fewer experts")  # fmt: skip
    parser.add_argument("--block-m", default=None,
                        help="comma list of block_m to try at every token count (default: by "
                             "mean rows per expert)")  # fmt: skip
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("tune_moe.py needs a CUDA GPU", file=sys.stderr)
        return 2
    try:
        names = model_names(args.models)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    shapes = [MODELS[n] for n in names]
    tokens = [int(t) for t in args.tokens.split(",")]
    block_ms = [int(b) for b in args.block_m.split(",")] if args.block_m else None
    if args.router_skew < 0 or any(b < 16 or b & (b - 1) for b in block_ms or []):
        print("tune_moe.py: --router-skew must be >= 0 and --block-m powers of two >= 16",
              file=sys.stderr)  # fmt: skip
        return 2
    dtype = getattr(torch, args.dtype)
    device_name = torch.cuda.get_device_name()
    path = CONFIG_DIR / config_file_name(device_name)
    doc = json.loads(path.read_text()) if path.exists() else {"shapes": {}}
    precompile(shapes, tokens, block_ms, dtype, args.workers)
    t0 = time.time()
    log: list[dict] = []
    for shape in shapes:
        key = shape_key(shape.num_experts, shape.inter_size, shape.hidden_size, dtype)
        # Buckets not tuned in this run keep their entries.
        tuned = tune_shape(
            shape, tokens, dtype, args.rep_ms, log, skew=args.router_skew, block_ms=block_ms
        )
        doc["shapes"].setdefault(key, {}).update(tuned)
    run = {**run_info(), "tuned": datetime.date.today().isoformat(), "models": names,
           "tokens": tokens, "router_skew": args.router_skew}  # fmt: skip
    # A partial run re-tunes some buckets and keeps the rest: every run is listed, so each
    # bucket's origin stays known (the top-level fields name the latest run).
    doc.setdefault("runs", []).append(run)
    doc.update({k: v for k, v in run.items() if k not in ("models", "tokens")})
    text = json.dumps(doc, indent=1, sort_keys=True) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)  # atomic: an engine loading the table meanwhile sees old or new, whole
    if args.out:
        args.out.write_text(text)
    if args.log:
        args.log.write_text(json.dumps({**run, "candidates": log}, indent=0) + "\n")
    print(f"tuned in {time.time() - t0:.1f} s; wrote {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
