"""`rimuru profile-hotness`: write the offline hotness ranking from sample prompts."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from pathlib import Path

from rimuru.cli_args import positive_int
from rimuru.dataplane.engine.flags import add_engine_arguments, engine_config_from_args


def add_arguments(p: argparse.ArgumentParser) -> None:
    # The engine that routes the prompts is the one `rimuru serve` would start with the
    # same flags (routing does not depend on the memory policy).
    add_engine_arguments(p)
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


def _check_writable(path: Path) -> None:
    folder = path.parent
    if path.is_dir():
        raise ValueError(
            f"--output {path} is a directory: give a file path, e.g. {path}/hotness.json"
        )
    if not folder.is_dir():
        raise ValueError(f"--output {path}: the directory {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise ValueError(f"--output {path}: the directory {folder} is not writable")


def run(args: argparse.Namespace) -> int:
    from rimuru.dataplane.bench.trace import check_trace_fits_model, load_trace
    from rimuru.dataplane.engine.hotness_profile import profile_hotness
    from rimuru.dataplane.parallel.launch import start_engine

    try:
        _check_writable(Path(args.output))  # before the profile, not after it
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
        engine = start_engine(engine_config_from_args(args))
        prompts = [list(r.prompt_token_ids) for r in trace.requests]
        ranking = profile_hotness(engine, prompts, source=f"{args.trace}: {len(prompts)} prompts")
        engine.close()
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
