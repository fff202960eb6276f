"""`rimuru plan --model M --memory-budget B`: will the model fit, and how many tokens of KV
cache does each policy leave — without loading a single weight.

Runs the engine's own start-up arithmetic on the model's shapes (see `capacity.py`), so a
30B model can be planned on a laptop. The activation reserve is estimated unless given; the
engine measures it on CUDA. Exit status 0 if at least one policy fits, 2 if none does.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from rimuru.dataplane.engine.flags import add_engine_arguments, engine_config_from_args
from rimuru.policy import MODES, parse_modes

if TYPE_CHECKING:  # torch and the model load only when a plan runs
    from rimuru.dataplane.model.config import ModelConfig


def add_arguments(p: argparse.ArgumentParser) -> None:
    # The engine's flags, --memory-budget required, and --policies for --mode: plan
    # compares the policies on one budget.
    add_engine_arguments(p, skip=("mode",), required=("memory_budget",))
    p.add_argument("--policies", default=",".join(MODES))
    p.add_argument(
        "--context-len",
        type=int,
        default=512,
        help="tokens per request for the 'requests' columns (ShareGPT averages ~400-500)",
    )


def run(args: argparse.Namespace) -> int:
    from rimuru.dataplane.engine.startup.capacity import PolicyCapacity, plan_capacity
    from rimuru.dataplane.model.checkpoint import model_config
    from rimuru.sizes import format_bytes

    policies = parse_modes(args.policies)
    if args.context_len < 1:
        raise ValueError("--context-len must be >= 1")
    config = engine_config_from_args(args)
    cap = plan_capacity(config, policies)
    mc = cap.model_config
    if config.tensor_parallel_size > 1:
        print(_tensor_parallel_line(config.tensor_parallel_size, model_config(config.model)))
    print(
        f"{args.model}: {mc.num_moe_layers} MoE layers x {mc.num_experts} experts; routed experts "
        f"{format_bytes(cap.expert_bytes)}, non-pool weights "
        f"{format_bytes(cap.non_pool_weight_bytes)}; activation reserve "
        f"{format_bytes(cap.activation_reserve_bytes)} "
        f"({'given' if config.activation_reserve is not None else 'estimated; the engine measures it on CUDA'})"
    )
    print(cap.geometry.describe())  # page sizes, and each padded slot's waste
    if cap.state_bytes_per_request:
        print(_state_line(cap))
    header = (
        "policy",
        "pool",
        "loading buffers",
        "experts at start",
        "KV tokens at start",
        "fewest experts",
        "KV tokens at most",
        f"requests of {args.context_len} tokens",
    )
    rows, failures = [], []
    for policy, item in zip(policies, cap.policies, strict=True):
        if not isinstance(item, PolicyCapacity):
            failures.append(f"{policy}: does not fit: {item}")
            continue
        rows.append(
            (
                policy,
                format_bytes(item.plan.pool_bytes),
                format_bytes(item.plan.loading_buffer_bytes),
                str(item.experts_at_start),
                str(item.kv_tokens_at_start),
                str(item.experts_at_least),
                str(item.kv_tokens_at_most),
                f"{cap.requests_of(item.kv_tokens_at_start, args.context_len)} .. "
                f"{cap.requests_of(item.kv_tokens_at_most, args.context_len)}",
            )
        )
    if rows:
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
        print("  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True)))
        for r in rows:
            print("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))
    # no CUDA graphs for hybrid models, nor with tensor parallel, yet
    if rows and not mc.is_hybrid and config.tensor_parallel_size == 1:
        print(_graph_line(mc, args))
    for line in failures:
        print(line, file=sys.stderr)
    return 0 if rows else 2


def _tensor_parallel_line(size: int, whole: ModelConfig) -> str:
    line = (
        f"tensor parallel {size}: every figure is one rank's (one GPU's, the budget is per "
        f"GPU); a rank holds 1/{size} of each expert and of the attention (and Gated DeltaNet) "
        f"heads, the embedding and LM head whole"
    )
    replicas = size // whole.num_kv_heads
    if replicas > 1:  # the KV pages above are then a whole head's
        line += (
            f"; the model's {whole.num_kv_heads} KV head(s) are fewer than the ranks, so each is "
            f"replicated on {replicas} ranks and every rank caches one whole KV head"
        )
    return line


def _state_line(cap) -> str:
    """A hybrid request's fixed cost beside its KV: one SSM and one conv page per GDN layer."""
    from rimuru.dataplane.memory.geometry import PageType
    from rimuru.sizes import format_bytes

    g, mc = cap.geometry, cap.model_config
    conv = format_bytes(g.bytes_of(PageType.CONV))
    if g.content_bytes_of(PageType.CONV) != g.bytes_of(PageType.CONV):
        conv += f" slot holding {format_bytes(g.content_bytes_of(PageType.CONV))}"
    kv_per_token = g.kv_page_bytes * mc.num_kv_layers / g.shape.block_size
    return (
        f"state pages per request: {len(mc.linear_attention_layers)} Gated DeltaNet layers x "
        f"(SSM page {format_bytes(g.bytes_of(PageType.SSM))} + conv page {conv}) = "
        f"{format_bytes(cap.state_bytes_per_request)}, as much as "
        f"{cap.state_bytes_per_request / kv_per_token:.0f} tokens of KV in the "
        f"{mc.num_kv_layers} attention layers; the requests column counts both"
    )


def _graph_line(mc, args: argparse.Namespace) -> str:
    """What the table leaves out on CUDA: the CUDA graphs' memory, set aside before the pool.
    The driver's part is priced from the shapes (cuda_graphs.py); the graphs' pools are
    measured by the engine at start-up."""
    from rimuru.dataplane.engine.graphs.piecewise_graphs import graph_driver_bytes
    from rimuru.sizes import format_bytes

    decode, pieces = graph_driver_bytes(
        mc.num_layers, args.max_num_seqs, args.max_num_batched_tokens
    )
    return (
        f"on CUDA (unless --enforce-eager) the engine sets the CUDA graphs' memory aside before "
        f"the pool, and the KV columns above overstate the KV by it: the driver's part "
        f"{format_bytes(int(1.1 * decode))} "
        f"for the decode graphs and {format_bytes(int(1.1 * pieces))} for the piecewise graphs "
        f"(device copy-in or the resident policy), plus their pools, measured at start-up "
        f"(docs/benchmarks.md lists what they took for the presets)"
    )
