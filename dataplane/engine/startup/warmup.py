"""Start-up warm-up: run the forward at every batch shape serving will meet, before serving.

Triton compiles a kernel variant the first time it meets new constexprs (a MoE tile config
per token bucket, the align step's power-of-two pair count, the decode merge's padded split
count); compiled mid-serving, each stalls the step that meets it, for seconds while
requests keep arriving. The warm-up pays those compiles once, at start-up, through the same
forward and kernels the engine serves with; what must stay true is that serving then
compiles nothing (bench/gpu_checks.py checks it on a GPU), so a new constexpr in a kernel's
key needs its batch here. Which batches, from the kernels' own keys:

  MoE       for every token count 1..max_num_batched_tokens, the smallest one of each
            distinct `fused_moe_variant` key: as that many one-token decodes if
            max_num_seqs allows, else as prompts of at most max_model_len tokens
  decode    one sequence at each context of `decode_warmup_contexts` (split variants)
  prefill   a prompt, and a chunk after an earlier chunk beside a decode (S > 1)
  sampler   one drawn row (kernels/exponential_race.py has one variant per vocabulary)

It runs on the profiling forward's ScratchRunner (profile_run.py), so it needs no engine
state and leaves none. Ints and pointer alignments that vary with the batch are not
specialised by the kernels, so these keys are all that decides a variant.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable

import torch

from rimuru.dataplane.engine.forward.profile_run import ScratchRunner, ScratchSeq
from rimuru.dataplane.memory.geometry import PageGeometry
from rimuru.dataplane.model import MoETransformer
from rimuru.dataplane.model.weights import ExpertWeights


def warmup_batches(
    max_num_batched_tokens: int,
    max_num_seqs: int,
    max_model_len: int,
    block_size: int,
    moe_key: Callable[[int], Hashable],
    decode_contexts: list[int],
) -> list[tuple[ScratchSeq, ...]]:
    """The batches the warm-up runs (module doc), each within the scheduler's limits.

    moe_key(num_tokens) names the MoE kernels a step of that many tokens launches."""
    decode = ScratchSeq(1, min(block_size, max_model_len) - 1)  # one block of context at most
    batches: list[tuple[ScratchSeq, ...]] = []
    seen: set = set()
    for tokens in range(1, max_num_batched_tokens + 1):
        key = moe_key(tokens)
        if key in seen:
            continue
        batch = _batch_of(tokens, decode, max_num_seqs, max_model_len)
        if batch is not None:  # else the scheduler cannot form such a step either
            seen.add(key)
            batches.append(batch)
    batches += [(ScratchSeq(1, c - 1),) for c in decode_contexts if 2 <= c <= max_model_len]
    prompt = min(max_num_batched_tokens, max_model_len)
    if prompt >= 2:
        batches.append((ScratchSeq(prompt, 0),))
    chunk = min(max_num_batched_tokens - 1, max_model_len // 2)
    if chunk >= 2 and max_num_seqs >= 2:
        batches.append((ScratchSeq(chunk, chunk), decode))
    return list(dict.fromkeys(batches))  # in order, each once


def _batch_of(
    tokens: int, decode: ScratchSeq, max_num_seqs: int, max_model_len: int
) -> tuple[ScratchSeq, ...] | None:
    if tokens <= max_num_seqs:
        return (decode,) * tokens
    full, rest = divmod(tokens, max_model_len)
    prompts = [max_model_len] * full + ([rest] if rest else [])
    if len(prompts) > max_num_seqs:
        return None
    return tuple(ScratchSeq(n, 0) for n in prompts)


def warm_up_sampler(vocab_size: int, device: torch.device) -> None:
    """Compile the sampler's one kernel variant: fp32 logits of the model's vocabulary."""
    from rimuru.kernels import exponential_race

    rows = torch.zeros(1, vocab_size, device=device)
    exponential_race(
        rows, torch.ones(1, device=device), torch.zeros(1, dtype=torch.long, device=device)
    )


def warm_up_routing_histogram(
    histogram, num_experts: int, top_k: int, device: torch.device
) -> None:
    """Compile the routing histogram's four variants: with and without graph padding rows
    (a row mask), with and without a running total (a layer's statistics; the host-copy
    path's prediction of the next layer counts without one)."""
    ids = torch.zeros(1, top_k, dtype=torch.int64, device=device)
    mask = torch.ones(1, dtype=torch.int64, device=device)
    total = torch.zeros(num_experts, dtype=torch.int64, device=device)
    for row_mask in (None, mask):
        for into in (None, total):
            histogram(ids, num_experts, row_mask, into)


def warm_up(
    model: MoETransformer,
    host_experts: list[ExpertWeights],
    geometry: PageGeometry,
    batches: list[tuple[ScratchSeq, ...]],
    moe_kernel,
    attention_kernels,
) -> float:
    """Run the forward (and the logits of each sequence's last token) once per batch; returns
    the seconds it took. The caller frees the scratch with its own empty_cache()."""
    scratch = ScratchRunner(model, host_experts, geometry, moe_kernel, attention_kernels)
    t0 = time.perf_counter()
    for batch in batches:
        scratch.prepare(batch)()
    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)
    return time.perf_counter() - t0
