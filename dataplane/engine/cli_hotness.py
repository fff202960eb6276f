"""`rimuru profile-hotness`: write the offline hotness ranking from sample prompts."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from rimuru.cli_args import positive_int


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny", help="preset name or local HF directory")
    p.add_argument("--device", default="cpu")
    p.add_argument("--router-skew", type=float, default=1.0)
    p.add_argument(
        "--trace", default="sharegpt_qwen_cpu", help="bundled trace or .npz with sample prompts"
    )
    p.add_argument(
        "--num-prompts",
        type=positive_int,
        default=None,
        help="default: 64, or all of a smaller trace",
    )
    p.add_argument(
        "--max-prompt-tokens", type=positive_int, default=256, help="each prompt's first N tokens"
    )
    p.add_argument("--output", "-o", default="hotness.json")


def run(args: argparse.Namespace) -> int:
    from rimuru.dataplane.bench.trace import check_trace_fits_model, load_trace
    from rimuru.dataplane.engine.config import EngineConfig
    from rimuru.dataplane.engine.engine import Engine
    from rimuru.dataplane.engine.hotness_profile import profile_hotness
    from rimuru.policy import Tunables

    try:
        trace = load_trace(args.trace)
        trace = trace.head(
            min(64, len(trace.requests)) if args.num_prompts is None else args.num_prompts
        )
        # Cut first: only the tokens profiled must fit the model's vocabulary.
        cut = tuple(
            replace(r, prompt_token_ids=r.prompt_token_ids[: args.max_prompt_tokens])
            for r in trace.requests
        )
        trace = replace(trace, requests=cut)
        check_trace_fits_model(trace, args.model)
        engine = Engine(
            EngineConfig(
                model=args.model,
                device=args.device,
                router_skew=args.router_skew,
                tunables=Tunables(mode="resident"),
                max_num_batched_tokens=1024,
                max_num_seqs=64,
            )
        )
        prompts = [list(r.prompt_token_ids) for r in trace.requests]
        ranking = profile_hotness(engine, prompts, source=f"{args.trace}: {len(prompts)} prompts")
    except ValueError as exc:
        print(f"rimuru profile-hotness: {exc}", file=sys.stderr)
        return 2
    ranking.save(args.output)
    top = ", ".join(
        f"L{layer}: e{ranking.order[layer][0]} ({ranking.prob[layer][0]:.2f})"
        for layer in range(min(4, ranking.num_layers))
    )
    print(
        f"wrote {args.output}: {ranking.num_layers} layers x {ranking.num_experts} experts; hottest {top}"
    )
    return 0
