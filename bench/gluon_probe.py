"""Probe: the Gluon warp-specialized MoE GEMMs (bench/gluon_gemms.py) against the product's.

Usage (GPU):  python bench/gluon_probe.py [--out DIR]

Not yet run on a GPU. Per case (tune_moe.py's experts: pool pages with a share in
loading-buffer slots, random routing) and GEMM, each variant runs beside the product kernel
at its tuned tile, paged and contiguous, same run, every output checked against the
product's contiguous one (the up GEMM on the rows that hold a pair; its Gluon version's time
includes presorting x). A wrong output is marked WRONG; a variant still running after 60 s
ends the run (exit 3) with the rows before it already written. Read the times knowing that
the Gluon kernels compute every row of a block (the product's tail tiles skip padding) and
that their epilogue does not overlap the next tile's wgmmas (one MMA partition). The table
is printed last and goes to DIR/gluon_probe.json.
"""

import argparse
import functools
import json
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from rimuru.kernels import get_moe_config
from rimuru.kernels.moe_align import moe_align_block_size
from rimuru.kernels.moe_gemm import WeightSource, launch_down_gemm, launch_up_gemm

sys.path.insert(0, str(Path(__file__).parent))
from gluon_gemms import DOWN_TILES, UP_TILES, launch_down, launch_up

CASES = [("qwen3-30b-a3b", 4096), ("mixtral-8x7b", 1024)]


@dataclass
class Case:
    """tune_moe.py's experts (pool pages, a share in loading-buffer slots) and routing."""

    shape: object
    config: object
    align: object
    x: torch.Tensor  # [T, D]
    act: torch.Tensor  # [R, I], the down GEMM's input (random)
    weights: torch.Tensor  # [P] fp32
    experts: object

    def sources(self, up: bool) -> dict[str, WeightSource]:
        stack = self.experts.w13 if up else self.experts.w2
        return {"contiguous": WeightSource(stack, stack, False, 0, stack.stride(0)),
                "paged": self.experts.paged_source()}  # fmt: skip


def make_case(name: str, num_tokens: int) -> Case:
    from tune_moe import MODELS, make_experts, random_routing

    shape = MODELS[name]
    dev = torch.device("cuda")
    experts = make_experts(shape, torch.bfloat16, dev, seed=0)
    config = get_moe_config(shape.num_experts, shape.inter_size, shape.hidden_size, num_tokens,
                            shape.top_k, torch.bfloat16, dev)  # fmt: skip
    ids, weights = random_routing(num_tokens, shape, dev, seed=num_tokens)
    align = moe_align_block_size(ids, shape.num_experts, config.block_m, experts.expert_table)
    gen = torch.Generator(device=dev).manual_seed(1)
    x = torch.randn(num_tokens, shape.hidden_size, generator=gen, device=dev).to(torch.bfloat16)
    act = torch.randn(align.max_blocks * config.block_m, shape.inter_size, generator=gen,
                      device=dev).to(torch.bfloat16)  # fmt: skip
    return Case(shape, config, align, x, act, weights.reshape(-1).float(), experts)


def variants(case: Case, gemm: str, out: torch.Tensor, sms: int) -> list[tuple[str, object]]:
    """(name, launcher writing `out`): the product's first (contiguous: the reference)."""
    s, up = case.shape, gemm == "up"
    found = []
    for kind, source in case.sources(up).items():
        if up:
            fn = functools.partial(launch_up_gemm, case.x, out, source, case.align, case.weights,
                                   case.config.gemm1, inter_size=s.inter_size, top_k=s.top_k)  # fmt: skip
        else:
            fn = functools.partial(launch_down_gemm, case.act, out, source, case.align,
                                   case.weights, case.config.gemm2, inter_size=s.inter_size,
                                   top_k=s.top_k)  # fmt: skip
        found.append((f"product {kind}", fn))
    for tile in UP_TILES if up else DOWN_TILES:
        for kind, source in case.sources(up).items():
            if up:
                fn = functools.partial(
                    launch_up, case.x, out, case.align, source, tile, sms, s.top_k
                )
            else:
                fn = functools.partial(launch_down, case.act, out, case.weights, case.align,
                                       source, tile, sms)  # fmt: skip
            found.append((f"gluon {kind} {tile}", fn))
    return found


WATCHDOG_S = 60.0  # a variant that has not finished by then is taken to hang


def _timed(fn, out: torch.Tensor, rows: torch.Tensor | None) -> tuple[float, torch.Tensor]:
    """Time of fn and its output (the compared rows only: rows of pairs for the up GEMM,
    whose padding rows and a tail tile's unwritten rows differ by design). A hang ends the
    process (exit 3) once the watchdog fires: the rows measured so far are already written."""
    from tune_moe import replay_ms

    watchdog = threading.Timer(WATCHDOG_S, _hung)
    watchdog.start()
    try:
        out.fill_(float("nan"))
        fn()
        torch.cuda.synchronize()
        result = (out if rows is None else out[rows]).float().clone()
        return replay_ms(fn, 20.0) * 1e3, result
    finally:
        watchdog.cancel()


def _hung() -> None:
    print(f"gluon_probe.py: a variant ran past {WATCHDOG_S:.0f} s; taken to hang", flush=True)
    os._exit(3)


def main() -> int:
    from tune_moe import run_info

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gluon_probe.py needs a CUDA GPU", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    table = []
    for name, n in CASES:
        case = make_case(name, n)
        used = case.align.sorted_pair_ids[: int(case.align.num_padded)]
        pair_rows = (used < case.align.num_pairs).nonzero()[:, 0]
        outputs = {
            "down": (torch.empty(case.weights.numel(), case.shape.hidden_size, dtype=case.x.dtype,
                                 device=case.x.device), None),
            "up": (torch.empty_like(case.act), pair_rows),
        }  # fmt: skip
        for gemm, (out, rows) in outputs.items():
            reference = base_us = None
            for variant, fn in variants(case, gemm, out, sms):
                try:
                    us, result = _timed(fn, out, rows)
                except Exception as exc:  # a fault poisons the context: later rows fail too
                    print(f"  {variant}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                    table.append({"model": case.shape.name, "tokens": n, "gemm": gemm,
                                  "variant": variant, "error": str(exc)[:200]})  # fmt: skip
                    continue
                if reference is None:  # the product's contiguous output
                    reference, base_us = result, us
                diff = float((result - reference).abs().max() / reference.abs().max())
                # Wrong output (NaN where a row was left unwritten, or a real difference):
                # its time means nothing.
                ok = bool(result.isfinite().all()) and diff <= 1e-2
                table.append({"model": case.shape.name, "tokens": n, "gemm": gemm,
                              "variant": variant, "us": us, "x_product": us / base_us,
                              "max_rel_diff": diff, "ok": ok})  # fmt: skip
                print(f"  {case.shape.name:18s} T={n} {gemm:4s} {variant:36s} {us:8.1f} us "
                      f"{us / base_us:6.3f}x rel diff {diff:.3g}{'' if ok else '  WRONG'}",
                      flush=True)  # fmt: skip
                (args.out / "gluon_probe.json").write_text(
                    json.dumps({**run_info(), "rows": table}, indent=1)
                )
        del case
        torch.cuda.empty_cache()
    print(f"\n{'model':18s} {'T':>5s} {'gemm':4s} {'variant':36s} {'us':>8s} {'x prod':>7s} "
          f"{'rel diff':>9s}")  # fmt: skip
    for r in table:
        if "error" in r:
            print(f"{r['model']:18s} {r['tokens']:5d} {r['gemm']:4s} {r['variant']:36s} failed")
            continue
        print(f"{r['model']:18s} {r['tokens']:5d} {r['gemm']:4s} {r['variant']:36s} "
              f"{r['us']:8.1f} {r['x_product']:7.3f} {r['max_rel_diff']:9.3g}"
              f"{'' if r['ok'] else '  WRONG'}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
