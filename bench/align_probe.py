"""The block-align step's three paths timed at every token count: which one to take when.

Usage (GPU):  python bench/align_probe.py [--out DIR] [--profile 1,16,64]

Why: the 11-30 15:27 breakdown at decode sizes (moe_breakdown.py --tokens 1,16,64,256) had
align at 58.9 us for Qwen3 at 16 tokens (one program, a [128 pairs, 128 experts] one-hot),
against 17.0 at 64 tokens (the chunked kernels): 22% of that MoE call. Per model (its tuned
block_m) and token count, each path of moe_align_block_size (ALIGN_PATHS: scan, sort,
chunked; the 15:34 and 15:42 runs also had a pairwise rank, since dropped) aligns random
routing (tune_moe.random_routing, seed = T) with an expert table, as the paged engine does,
timed as the tuner times (CUDA-graph replays, L2 flushed); a single-program path whose block
exceeds 2^17 elements is left out, and each path's alignment is first compared with the
torch reference (a wrong one is marked and not timed). The table is printed last, with the
path the launcher takes today; the figures go to DIR/align_probe.json.
"""

import argparse
import functools
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
from triton.runtime.errors import OutOfResources

sys.path.insert(0, str(Path(__file__).parent))
from tune_moe import MODELS, TOKEN_COUNTS, random_routing, replay_ms, run_info

from rimuru.kernels import get_moe_config
from rimuru.kernels.moe_align import (
    ALIGN_PATHS,
    MoeAlignment,
    align_variant,
    moe_align_block_size,
    moe_align_block_size_reference,
)

DEVICE = torch.device("cuda")
# One program's block, in elements, beyond which a single-program path is not tried: the
# default path switches to chunked at 16384, and far larger blocks compile for minutes.
PROBE_MAX_BLOCK = 1 << 17


def same_alignment(got: MoeAlignment, ref: MoeAlignment, table: torch.Tensor) -> bool:
    """Whether ``got`` (any path, any device) aligns as the torch reference does: the same
    rows in use, the same expert per block, the same pairs in each block (their order inside
    an expert's run is free), and each block's page ids copied from ``table``."""
    used = int(ref.num_padded)
    if int(got.num_padded) != used:
        return False
    if not torch.equal(got.block_expert_ids.cpu(), ref.block_expert_ids):
        return False
    rows_got = got.sorted_pair_ids[:used].cpu().view(-1, ref.block_m).sort(dim=1).values
    rows_ref = ref.sorted_pair_ids[:used].view(-1, ref.block_m).sort(dim=1).values
    if not torch.equal(rows_got, rows_ref):
        return False
    blocks = used // ref.block_m
    experts = ref.block_expert_ids[:blocks].long()
    return torch.equal(got.block_pages[:blocks].cpu(), table.cpu()[experts])


@dataclass(frozen=True)
class Case:
    """One model at one token count: its routing, tuned block_m and a random expert table."""

    name: str
    tokens: int
    ids: torch.Tensor  # [T, K] int32
    num_experts: int
    block_m: int
    table: torch.Tensor  # [E, 3] int32

    def paths(self):
        """(path, launcher) of each path whose one-program block is small enough to try."""
        cells = triton.next_power_of_2(self.ids.numel()) * triton.next_power_of_2(self.num_experts)
        for path in ALIGN_PATHS:
            if path == "chunked" or cells <= PROBE_MAX_BLOCK:
                yield path, functools.partial(moe_align_block_size, self.ids, self.num_experts,
                                              self.block_m, self.table, path=path)  # fmt: skip


def cases(name: str, tokens: list[int]):
    shape = MODELS[name]
    E, k = shape.num_experts, shape.top_k
    table = torch.randint(0, 1 << 20, (E, 3), dtype=torch.int32, device=DEVICE)
    for n in tokens:
        ids, _ = random_routing(n, shape, DEVICE, seed=n)
        bm = get_moe_config(E, shape.inter_size, shape.hidden_size, n, k, torch.bfloat16,
                            DEVICE).block_m  # fmt: skip
        yield Case(shape.name, n, ids, E, bm, table)


def probe_model(name: str, tokens: list[int], rep_ms: float) -> list[dict]:
    rows = []
    for c in cases(name, tokens):
        us, wrong = {}, []
        reference = moe_align_block_size_reference(c.ids.cpu(), c.num_experts, c.block_m)
        for path, fn in c.paths():
            try:
                got = fn()
            except (ValueError, OutOfResources) as exc:  # its block does not fit one program
                print(f"    {path} at T={c.tokens}: {type(exc).__name__}: {str(exc)[:100]}",
                      flush=True)  # fmt: skip
                continue
            if not same_alignment(got, reference, c.table):
                wrong.append(path)
                print(f"    {path} at T={c.tokens}: WRONG alignment (not timed)", flush=True)
                continue
            us[path] = 1e3 * replay_ms(fn, rep_ms)
        pairs = c.ids.numel()
        rows.append({"model": c.name, "tokens": c.tokens, "pairs": pairs, "block_m": c.block_m,
                     "us": us, "wrong": wrong,
                     "default": align_variant(pairs, c.num_experts, c.block_m)[0]})  # fmt: skip
        print(f"  {c.name:18s} T={c.tokens:5d} " + " ".join(f"{p} {t:6.1f}" for p, t in us.items()),
              flush=True)  # fmt: skip
    return rows


def kernel_times(name: str, tokens: list[int]) -> list[dict]:
    """Each launched kernel's device time (torch.profiler, CUDA activity) in one call of each
    path, after a warm-up call: where a path's time goes."""
    from torch.profiler import ProfilerActivity, profile

    rows = []
    for c in cases(name, tokens):
        for path, fn in c.paths():
            try:
                fn()
            except (ValueError, OutOfResources):
                continue
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                fn()
                torch.cuda.synchronize()
            kernels = [(e.name, e.device_time) for e in prof.events()
                       if e.device_type == torch.autograd.DeviceType.CUDA]  # fmt: skip
            rows.append({"model": c.name, "tokens": c.tokens, "path": path, "kernels": kernels})
            print(f"  {c.name:18s} T={c.tokens:5d} {path:8s} "
                  + "; ".join(f"{kn[:32]} {t:.1f}" for kn, t in kernels), flush=True)  # fmt: skip
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--rep-ms", type=float, default=20.0)
    parser.add_argument("--profile", default=None, metavar="T,T,...",
                        help="instead: each kernel's device time at these token counts")  # fmt: skip
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("align_probe.py needs a CUDA GPU", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    if args.profile:
        tokens = [int(t) for t in args.profile.split(",")]
        rows = [r for name in sorted(MODELS) for r in kernel_times(name, tokens)]
        (args.out / "align_kernels.json").write_text(json.dumps({**run_info(), "rows": rows}))
        return 0
    rows = []
    for name in sorted(MODELS):
        rows += probe_model(name, TOKEN_COUNTS, args.rep_ms)
        (args.out / "align_probe.json").write_text(
            json.dumps({**run_info(), "rows": rows}, indent=1)
        )
    print(
        "\n==== block-align paths (us, CUDA-graph replays, L2 flushed; default = today's pick) ===="
    )
    print(f"{'model':18s} {'T':>5} {'pairs':>6} {'bm':>4} " + " ".join(f"{p:>9}" for p in ALIGN_PATHS)
          + f" {'default':>9} {'fastest':>9}  wrong")  # fmt: skip
    for r in rows:
        cells = " ".join(f"{r['us'][p]:9.1f}" if p in r["us"] else f"{'-':>9}" for p in ALIGN_PATHS)
        fastest = min(r["us"], key=r["us"].get)
        print(f"{r['model']:18s} {r['tokens']:5d} {r['pairs']:6d} {r['block_m']:4d} {cells} "
              f"{r['default']:>9} {fastest:>9}  {','.join(r['wrong']) or '-'}")  # fmt: skip
    return 1 if any(r["wrong"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
