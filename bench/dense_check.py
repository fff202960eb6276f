"""Is the fused MoE's gap to its floor in the GEMM main loops, or in the MoE around them?

Usage (GPU):  python bench/dense_check.py [--out DIR]
       (CPU): python bench/dense_check.py --plot DIR/dense_check.json --out FILE.png

Shape key: T = tokens, K = top-k, P = T*K pairs, E = experts, I = expert intermediate, D = hidden.

Per case (the shapes and token counts where the contiguous kernel misses 1.5x its floor) and
GEMM, same run, contiguous stacks, CUDA-graph replays with L2 flushed (tune_moe.replay_ms):

    routed   the product kernel, tuned tile, random routing (kernels_gpu.py's seed = T);
             also with other group_m (the tile order's L2 reuse)
    dense    the product kernel with every pair routed to expert 0: one expert, P rows, no
             padding and one expert's weights, i.e. a dense GEMM through the same main loop;
             the tuned tile and a few others (best kept)
    cublas   torch.matmul on that dense GEMM ([P, D] x [D, 2I]; [P, I] x [I, D])
    grouped  torch._grouped_mm (torch's own grouped GEMM for MoE) on the routed rows, sorted
             by expert without padding, offsets per expert: what a vendor grouped GEMM does
             with the same routing (it cannot read pages: no table, one [E, K, N] stack).
             Less work than ours: its x rows are gathered before the timed call, and it
             applies no SiLU(gate)*up, no routing weight and no scatter to pair order

dense / cublas is the main loop's own gap; routed / dense is what routing adds (padding rows,
tail tiles, E experts' weights). Each dense tile's output is checked against torch first; a
tile whose output is off (or left unwritten: NaN) is reported and not timed. The table is
printed last; the figures go to DIR/dense_check.json.
"""

import argparse
import functools
import json
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from moe_breakdown import gemm_floors_us
from tune_moe import (
    MODELS,
    PEAK_FLOPS,
    MoeShape,
    group_m_variants,
    random_routing,
    replay_ms,
    run_info,
)

from rimuru.kernels import get_moe_config
from rimuru.kernels.moe_align import MoeAlignment, moe_align_block_size
from rimuru.kernels.moe_configs import GemmTile
from rimuru.kernels.moe_gemm import WeightSource, launch_down_gemm, launch_up_gemm

CASES = [
    ("mixtral-8x7b", 1024),
    ("qwen1.5-moe-a2.7b", 2048),
    ("qwen1.5-moe-a2.7b", 4096),
    ("qwen3-30b-a3b", 2048),
    ("qwen3-30b-a3b", 4096),
]
# Other tiles for the dense GEMM (block_n, block_k, num_warps, num_stages), TMA, no tail, one
# tile a program and flattened: the tuned tile was chosen on routed work, where padding and
# tails weigh in. (11-30 15:20: the first run built these with num_warps in group_m's place.)
DENSE_UP_TILES = [(128, 64, 8, 3), (128, 64, 8, 4), (64, 64, 4, 4), (128, 64, 4, 3)]
MAX_REL_DIFF = 1e-2  # bf16 outputs against fp32 torch: 0.0022-0.0026 seen (11-30 14:55-15:00)
DENSE_DOWN_TILES = [(256, 64, 8, 3), (128, 64, 8, 4), (128, 128, 8, 3), (128, 64, 4, 3)]


@dataclass
class Problem:
    """One layer's stacks, its input and a routing, with the buffers the GEMMs write."""

    shape: MoeShape
    x: torch.Tensor  # [T, D]
    w13: torch.Tensor  # [E, 2I, D]
    w2: torch.Tensor  # [E, D, I]
    weights: torch.Tensor  # [P] fp32
    align: MoeAlignment
    act: torch.Tensor  # [R, I], the up GEMM's output and the down GEMM's input
    y: torch.Tensor  # [P, D]

    def up(self, tile: GemmTile):
        src = WeightSource(self.w13, self.w13, False, 0, self.w13.stride(0))
        return functools.partial(launch_up_gemm, self.x, self.act, src, self.align, self.weights,
                                 tile, inter_size=self.shape.inter_size, top_k=self.shape.top_k)  # fmt: skip

    def down(self, tile: GemmTile):
        src = WeightSource(self.w2, self.w2, False, 0, self.w2.stride(0))
        return functools.partial(launch_down_gemm, self.act, self.y, src, self.align,
                                 self.weights, tile, inter_size=self.shape.inter_size,
                                 top_k=self.shape.top_k)  # fmt: skip


def make_problem(shape: MoeShape, x, w13, w2, ids, topk_weights, block_m: int) -> Problem:
    align = moe_align_block_size(ids, shape.num_experts, block_m)
    rows = align.max_blocks * block_m
    act = torch.randn(rows, shape.inter_size, device=x.device).to(x.dtype)
    y = torch.empty(ids.numel(), shape.hidden_size, device=x.device, dtype=x.dtype)
    w = topk_weights.reshape(-1).float().contiguous()
    return Problem(shape, x, w13, w2, w, align, act, y)


def dense_routing(num_tokens: int, top_k: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Every pair to expert 0, weights 1/K: one expert holds all P rows."""
    ids = torch.zeros(num_tokens, top_k, dtype=torch.int32, device=device)
    return ids, torch.full((num_tokens, top_k), 1.0 / top_k, device=device)


def check_dense(p: Problem, up_tile: GemmTile, down_tile: GemmTile) -> tuple[float, float]:
    """Max relative difference of the dense problem's two GEMMs from torch (fp32 math):
    the up GEMM's rows of pairs, then the down GEMM's pair rows on that same act."""
    inter, k = p.shape.inter_size, p.shape.top_k
    p.act.fill_(float("nan"))
    p.up(up_tile)()
    used = p.align.sorted_pair_ids[: int(p.align.num_padded.item())].long()
    rows = (used < p.align.num_pairs).nonzero()[:, 0]  # rows that hold a pair (not padding)
    tokens = used[rows] // k
    h = p.x.float() @ p.w13[0].float().T  # [T, 2I]
    want_act = (F.silu(h[:, :inter]) * h[:, inter:])[tokens]
    got_act = p.act[rows].float()
    up_diff = float((got_act - want_act).abs().max() / want_act.abs().max())
    p.y.fill_(float("nan"))
    p.down(down_tile)()
    want_y = torch.empty(p.y.shape, device=p.y.device)
    want_y[used[rows]] = (p.act[rows].float() @ p.w2[0].float().T) * p.weights[used[rows], None]
    down_diff = float((p.y.float() - want_y).abs().max() / want_y.abs().max())
    return up_diff, down_diff


def grouped_us(shape: MoeShape, x, w13, w2, ids, rep_ms: float) -> dict[str, float]:
    """torch._grouped_mm on the routed rows (module doc); NaN where this torch lacks it."""
    E, inter, k = shape.num_experts, shape.inter_size, shape.top_k
    order = torch.argsort(ids.reshape(-1), stable=True)  # pairs sorted by expert
    offs = torch.cumsum(torch.bincount(ids.reshape(-1), minlength=E), 0).to(torch.int32)
    a_up = x[order // k]  # [P, D]
    a_down = torch.randn(order.numel(), inter, device=x.device).to(x.dtype)  # [P, I]
    out = {}
    for gemm, a, b in (("up", a_up, w13.transpose(1, 2)), ("down", a_down, w2.transpose(1, 2))):
        try:
            out[gemm] = 1e3 * replay_ms(
                functools.partial(torch._grouped_mm, a, b, offs=offs), rep_ms
            )
        except Exception as exc:  # no grouped GEMM for this GPU or torch
            print(f"    grouped {gemm}: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
            out[gemm] = float("nan")
    return out


def output_ok(diff: float) -> bool:
    """Whether check_dense's difference passes; NaN (a row left unwritten) does not."""
    return diff <= MAX_REL_DIFF


def run_case(name: str, num_tokens: int, rep_ms: float) -> dict:
    shape = MODELS[name]
    dev, dt = torch.device("cuda"), torch.bfloat16
    E, inter, D, k = shape.num_experts, shape.inter_size, shape.hidden_size, shape.top_k
    gen = torch.Generator(device=dev).manual_seed(0)
    w13 = (torch.randn(E, 2 * inter, D, generator=gen, device=dev) * D**-0.5).to(dt)
    w2 = (torch.randn(E, D, inter, generator=gen, device=dev) * inter**-0.5).to(dt)
    x = torch.randn(num_tokens, D, generator=gen, device=dev).to(dt)
    config = get_moe_config(E, inter, D, num_tokens, k, dt, dev)
    bm = config.block_m
    routed = make_problem(
        shape, x, w13, w2, *random_routing(num_tokens, shape, dev, num_tokens), bm
    )
    dense = make_problem(shape, x, w13, w2, *dense_routing(num_tokens, k, dev), bm)
    P = num_tokens * k
    flops = {"up": 2 * P * D * 2 * inter, "down": 2 * P * inter * D}
    row: dict = {"model": shape.name, "tokens": num_tokens, "config": config.to_json()}
    tiles = {
        gemm: [tuned, replace(tuned, tail=0, schedule="flattened")]
        + [GemmTile(n, k, 8, w, s, tma=True, schedule=sched)
           for n, k, w, s in others for sched in ("grid", "flattened")]
        for gemm, tuned, others in (("up", config.gemm1, DENSE_UP_TILES),
                                    ("down", config.gemm2, DENSE_DOWN_TILES))
    }  # fmt: skip
    diffs = {}
    grouped = grouped_us(shape, x, w13, w2, random_routing(num_tokens, shape, dev, num_tokens)[0],
                         rep_ms)  # fmt: skip
    for gemm in ("up", "down"):
        launch_routed = routed.up if gemm == "up" else routed.down
        launch_dense = dense.up if gemm == "up" else dense.down
        us = {"routed": 1e3 * replay_ms(launch_routed(tiles[gemm][0]), rep_ms)}
        # The tile order on routed work: GROUP_M row blocks (several experts' blocks) sweep
        # the same weight columns together; does L2 reuse across them matter?
        group_us = {
            t.group_m: 1e3 * replay_ms(launch_routed(t), rep_ms)
            for t in group_m_variants(tiles[gemm][0])
        }
        dense_us = {}
        for tile in dict.fromkeys(tiles[gemm]):
            try:
                up_t = tile if gemm == "up" else config.gemm1
                down_t = tile if gemm == "down" else config.gemm2
                diff = check_dense(dense, up_t, down_t)[gemm == "down"]
                diffs[(gemm, tile)] = diff
                if not output_ok(diff):
                    print(f"    {gemm} {tile}: WRONG output (max rel diff {diff:.3g})", flush=True)
                    continue
                dense_us[tile] = 1e3 * replay_ms(launch_dense(tile), rep_ms)
            except Exception as exc:  # out of shared memory or registers: not a candidate
                print(f"    {gemm} {tile}: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
        best = min(dense_us, key=dense_us.get)
        us["dense_tuned"] = dense_us.get(tiles[gemm][0], float("nan"))
        us["dense_best"] = dense_us[best]
        a = torch.empty(P, D if gemm == "up" else inter, device=dev).normal_().to(dt)
        b = w13[0].T if gemm == "up" else w2[0].T  # transposed views: cuBLAS reads in place
        c = torch.empty(P, b.shape[1], device=dev, dtype=dt)
        us["cublas"] = 1e3 * replay_ms(functools.partial(torch.matmul, a, b, out=c), rep_ms)
        us["grouped"] = grouped[gemm]
        row[gemm] = {
            **{f"{v}_us": t for v, t in us.items()},
            "dense_best_tile": asdict(best),
            # Over the tiles timed (a wrong one is not); NaN-safe: every value is finite.
            "max_rel_diff": max(diffs[(gemm, t)] for t in dense_us),
            "floor_us": 1e6 * flops[gemm] / PEAK_FLOPS,
            "routed_floor_us": routed_floor(shape, num_tokens)[gemm],
            "routed_over_dense": us["routed"] / us["dense_best"],
            "dense_over_cublas": us["dense_best"] / us["cublas"],
            "routed_over_grouped": us["routed"] / us["grouped"],
            "cublas_tflops": flops[gemm] / us["cublas"] / 1e6,
            "dense_tflops": flops[gemm] / us["dense_best"] / 1e6,
            "all_dense_us": {str(t): v for t, v in dense_us.items()},
            "routed_group_m_us": group_us,
        }
        g = row[gemm]
        print(f"  {shape.name:18s} T={num_tokens} {gemm:4s} routed {g['routed_us']:7.1f} dense "
              f"{g['dense_best_us']:7.1f} cublas {g['cublas_us']:7.1f} us", flush=True)  # fmt: skip
    return row


def summarize(rows: list[dict]) -> None:
    print("\n==== dense check (bf16, contiguous; us; floor = FLOPs / 755 TFLOP/s) ====")
    print(f"{'model':18s} {'T':>5} {'gemm':4s} {'floor':>7} {'routed':>7} {'dense':>7} {'tuned':>7} "
          f"{'cublas':>7} {'groupd':>7} {'r/d':>5} {'d/cub':>5} {'r/grp':>5} {'TF/s d':>6} {'TF/s c':>6} {'diff':>8}")  # fmt: skip
    for r in rows:
        if "error" in r:
            print(f"{r['model']:18s} {r['tokens']:5d} FAILED {r['error']}")
            continue
        for gemm in ("up", "down"):
            g = r[gemm]
            print(f"{r['model']:18s} {r['tokens']:5d} {gemm:4s} {g['floor_us']:7.1f} {g['routed_us']:7.1f} "
                  f"{g['dense_best_us']:7.1f} {g['dense_tuned_us']:7.1f} {g['cublas_us']:7.1f} "
                  f"{g['grouped_us']:7.1f} {g['routed_over_dense']:5.2f} {g['dense_over_cublas']:5.2f} "
                  f"{g['routed_over_grouped']:5.2f} "
                  f"{g['dense_tflops']:6.0f} {g['cublas_tflops']:6.0f} {g['max_rel_diff']:8.2g}")  # fmt: skip
            groups = " ".join(f"{m}:{t:.1f}" for m, t in g["routed_group_m_us"].items())
            print(
                f"{'':24s} routed by group_m (tuned {r['config']['gemm1' if gemm == 'up' else 'gemm2']['group_m']}): {groups}"
            )


# Bars per case and GEMM, each over the FLOP floor (what the 1.5x target is measured against).
PLOT_BARS = (("cublas_us", "cuBLAS, dense"), ("dense_best_us", "product, dense"),
             ("routed_us", "product, routed"), ("grouped_us", "torch._grouped_mm, routed"))  # fmt: skip


def routed_floor(shape: MoeShape, num_tokens: int) -> dict[str, float]:
    """Each GEMM's floor on the routed problem, as kernels_gpu.py and moe_breakdown.py count
    it: max(FLOPs / 755 TFLOP/s, bytes / 4.17 TB/s), the weights of every expert included.
    Every expert is touched in CASES: an expert misses P >= 136 E pairs with odds e^-136."""
    up, down = gemm_floors_us(shape, num_tokens, shape.num_experts)
    return {"up": up, "down": down}


def plot(rows: list[dict], path: Path) -> dict[str, list[float]]:
    """A PNG of each GEMM's times over the routed problem's floor (the issue's floor; the
    dense problem's own floor, FLOPs alone, is at most that); drawn here from a run's JSON
    (the GPU image has no matplotlib). Returns the plotted heights by bar label."""
    from matplotlib.figure import Figure

    by_name = {shape.name: shape for shape in MODELS.values()}
    cases = [(r, g) for r in rows if "error" not in r for g in ("up", "down")]
    floors = [routed_floor(by_name[r["model"]], r["tokens"])[g] for r, g in cases]
    heights = {label: [r[g][key] / f for (r, g), f in zip(cases, floors, strict=True)]
               for key, label in PLOT_BARS}  # fmt: skip
    fig = Figure(figsize=(11, 4.2))
    ax = fig.add_subplot()
    width = 0.8 / len(PLOT_BARS)
    for i, (label, values) in enumerate(heights.items()):
        ax.bar([c + (i - 1.5) * width for c in range(len(cases))], values, width, label=label)
    ax.axhline(1.5, color="k", linestyle="--", linewidth=1, label="1.5x floor (target, whole MoE)")
    ax.set_xticks(range(len(cases)))
    ax.set_xticklabels([f"{r['model'].split('-')[0]}\nT={r['tokens']} {g}" for r, g in cases],
                       fontsize=8)  # fmt: skip
    ax.set_ylabel("time / routed floor")
    ax.set_title("MoE GEMMs: main loop (dense) vs routing (routed), H200, bf16")
    ax.legend(fontsize=8, ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.14))
    fig.savefig(path, dpi=120, bbox_inches="tight")
    return heights


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--rep-ms", type=float, default=50.0)
    parser.add_argument("--plot", type=Path, metavar="JSON",
                        help="no GPU: draw a run's dense_check.json as PNG into --out")  # fmt: skip
    args = parser.parse_args()
    if args.plot:
        rows = json.loads(args.plot.read_text())["rows"]
        png = args.out / args.plot.with_suffix(".png").name if args.out.is_dir() else args.out
        plot(rows, png)
        print(f"wrote {png}")
        return 0
    if not torch.cuda.is_available():
        print("dense_check.py needs a CUDA GPU", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, n in CASES:
        try:
            rows.append(run_case(name, n, args.rep_ms))
        except Exception as exc:
            rows.append({"model": name, "tokens": n, "error": repr(exc)[:300]})
        torch.cuda.empty_cache()
        (args.out / "dense_check.json").write_text(
            json.dumps({**run_info(), "rows": rows}, indent=1)
        )
    summarize(rows)
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
