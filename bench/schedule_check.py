"""Each schedule and the presort of the MoE GEMMs against one tile a program, same run: output and time.

Usage (GPU):  python bench/schedule_check.py [--tokens 2048] [--out DIR]

Per model (tune_moe.py's paged experts and routing, seed = T) and GEMM, the committed table's
tile for T runs with each schedule of moe_configs.SCHEDULES, and the up GEMM's also with x's
rows presorted (through TMA; its time includes the sort). Each output is compared with the
grid schedule's (the same tile computes the same sums in the same order, so they should be
equal) and timed like tune_moe.py. A variant that faults or corrupts shows here in seconds,
under its own step limit. The table is printed last; the figures go to
DIR/schedule_check.json.
"""

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from tune_moe import MODELS, gemm_closures, make_experts, model_names, replay_ms, run_info

from rimuru.kernels import get_moe_config
from rimuru.kernels.moe_configs import SCHEDULES, GemmTile

DEVICE = torch.device("cuda")


def variant_tiles(tile: GemmTile, up: bool) -> dict[str, GemmTile]:
    """The tile under every schedule, and (up GEMM) with x's rows presorted through TMA."""
    # The table's tile may presort: every schedule is compared on gathered rows.
    tiles = {s: dataclasses.replace(tile, schedule=s, presort=False) for s in SCHEDULES}
    if up:
        tiles["presort"] = dataclasses.replace(tile, tma=True, presort=True)
        tiles["presort persistent"] = dataclasses.replace(
            tile, tma=True, presort=True, schedule="persistent"
        )
    return tiles


def check_model(name: str, num_tokens: int, rep_ms: float) -> list[dict]:
    shape = MODELS[name]
    experts = make_experts(shape, torch.bfloat16, DEVICE, seed=0)
    config = get_moe_config(
        shape.num_experts, shape.inter_size, shape.hidden_size, num_tokens, shape.top_k,
        torch.bfloat16, DEVICE,
    )  # fmt: skip
    up, down, act_out, y, align = gemm_closures(
        experts, shape, num_tokens, config.block_m, seed=num_tokens
    )
    # The up GEMM's rows that hold a pair: what padding rows hold differs by design (zeros
    # from gathered rows, anything from presorted ones) and never reaches the output.
    pair_rows = (align.sorted_pair_ids[: int(align.num_padded)] < align.num_pairs).nonzero()[:, 0]
    rows = []
    for gemm, make, out, tile in (
        ("up", up, act_out, config.gemm1),
        ("down", down, y, config.gemm2),
    ):
        grid_out = grid_ms = None
        for name, variant in variant_tiles(tile, gemm == "up").items():
            fn = make(variant)
            out.fill_(float("nan"))  # what a schedule leaves unwritten stays NaN
            fn()
            torch.cuda.synchronize()
            result = out[pair_rows] if gemm == "up" else out
            result = result.float().nan_to_num(nan=12345.0)  # NaN == NaN where both left it
            ms = replay_ms(fn, rep_ms)
            if name == "grid":
                grid_out, grid_ms = result, ms
            diff = float((result - grid_out).abs().max() / grid_out.abs().max())
            rows.append({"model": shape.name, "tokens": num_tokens, "gemm": gemm,
                         "variant": name, "tile": dataclasses.asdict(variant),
                         "us": ms * 1e3, "over_grid": ms / grid_ms, "max_rel_diff": diff})  # fmt: skip
            print(f"  {shape.name:18s} {gemm:4s} {name:18s} {ms * 1e3:8.1f} us "
                  f"{ms / grid_ms:6.3f}x  max rel diff {diff:.3g}", flush=True)  # fmt: skip
    del experts
    torch.cuda.empty_cache()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="all", help=f"comma list of {sorted(MODELS)} or 'all'")
    parser.add_argument("--tokens", default="2048", help="comma list of token counts")
    parser.add_argument("--rep-ms", type=float, default=20.0)
    parser.add_argument("--out", type=Path, default=None, help="write schedule_check.json here")
    args = parser.parse_args()
    try:
        names = model_names(args.models)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("schedule_check.py needs a CUDA GPU", file=sys.stderr)
        return 2
    tokens = [int(t) for t in args.tokens.split(",")]
    rows = [r for name in names for n in tokens for r in check_model(name, n, args.rep_ms)]
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        report = {**run_info(), "rows": rows}
        (args.out / "schedule_check.json").write_text(json.dumps(report, indent=1) + "\n")
    print(f"\n{'model':18s} {'gemm':4s} {'variant':18s} {'us':>8s} {'x grid':>7s} {'rel diff':>9s}")
    for r in rows:
        print(f"{r['model']:18s} {r['gemm']:4s} {r['variant']:18s} {r['us']:8.1f} "
              f"{r['over_grid']:7.3f} {r['max_rel_diff']:9.3g}")  # fmt: skip
    # A schedule is a different walk over the same tiles, and presort a different path to
    # the same rows: any difference beyond a bf16 rounding of the largest output is a bug.
    bad = [r for r in rows if r["max_rel_diff"] > 1e-2]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
