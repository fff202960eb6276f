"""Start-up warm-up: run the forward at every batch shape serving will meet, before serving.

Triton compiles a kernel variant the first time it meets new constexprs (a MoE tile config
per token bucket, the align step's power-of-two pair count, the decode merge's padded split
count). Compiled mid-serving, each costs a stall of a second or more: on the H200 every
cold Fig. 4 run stepped at 1-3 s for its first ~10 s, while requests arrived at 10 req/s
(docs/benchmarks.md). The warm-up pays those compiles once, at start-up, through the same
forward and kernels the engine serves with. Which batches, from the kernels' own keys:

  MoE       for every token count 1..max_num_batched_tokens, the smallest one of each
            distinct `fused_moe_variant` key: as that many one-token decodes if
            max_num_seqs allows, else as prompts of at most max_model_len tokens
  decode    one sequence at each context of `decode_warmup_contexts` (split variants)
  prefill   a prompt, and a chunk after an earlier chunk beside a decode (S > 1)

It runs on a scratch KV pool of a few pages per layer (block tables cycle over them: the
values read are irrelevant, only the shapes are; the pool is zeroed so no NaN reaches the
router) and every expert read from one loading-buffer slot, so it needs no engine state and
leaves none. Ints and pointer alignments that vary with the batch are not specialised by
the kernels, so these keys are all that decides a variant.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import numpy as np
import torch

from rimuru.dataplane.engine.paged_attention import (
    PagedAttention,
    PagedAttentionMeta,
    SequenceSlice,
)
from rimuru.dataplane.engine.profile_run import OneSlotExperts
from rimuru.dataplane.memory.geometry import PageGeometry
from rimuru.dataplane.memory.pool import UnifiedPool
from rimuru.dataplane.model import MoETransformer
from rimuru.dataplane.model.weights import ExpertWeights

SCRATCH_BLOCKS = 4  # KV pages per layer in the scratch pool; block tables cycle over them


@dataclass(frozen=True)
class WarmupSeq:
    num_new_tokens: int
    num_computed_tokens: int


def warmup_batches(
    max_num_batched_tokens: int,
    max_num_seqs: int,
    max_model_len: int,
    block_size: int,
    moe_key: Callable[[int], Hashable],
    decode_contexts: list[int],
) -> list[tuple[WarmupSeq, ...]]:
    """The batches the warm-up runs (module doc), each within the scheduler's limits.

    moe_key(num_tokens) names the MoE kernels a step of that many tokens launches."""
    decode = WarmupSeq(1, min(block_size, max_model_len) - 1)  # one block of context at most
    batches: list[tuple[WarmupSeq, ...]] = []
    seen: set = set()
    for tokens in range(1, max_num_batched_tokens + 1):
        key = moe_key(tokens)
        if key in seen:
            continue
        batch = _batch_of(tokens, decode, max_num_seqs, max_model_len)
        if batch is not None:  # else the scheduler cannot form such a step either
            seen.add(key)
            batches.append(batch)
    batches += [(WarmupSeq(1, c - 1),) for c in decode_contexts if 2 <= c <= max_model_len]
    prompt = min(max_num_batched_tokens, max_model_len)
    if prompt >= 2:
        batches.append((WarmupSeq(prompt, 0),))
    chunk = min(max_num_batched_tokens - 1, max_model_len // 2)
    if chunk >= 2 and max_num_seqs >= 2:
        batches.append((WarmupSeq(chunk, chunk), decode))
    return list(dict.fromkeys(batches))  # in order, each once


def _batch_of(
    tokens: int, decode: WarmupSeq, max_num_seqs: int, max_model_len: int
) -> tuple[WarmupSeq, ...] | None:
    if tokens <= max_num_seqs:
        return (decode,) * tokens
    full, rest = divmod(tokens, max_model_len)
    prompts = [max_model_len] * full + ([rest] if rest else [])
    if len(prompts) > max_num_seqs:
        return None
    return tuple(WarmupSeq(n, 0) for n in prompts)


def warm_up(
    model: MoETransformer,
    host_experts: list[ExpertWeights],
    geometry: PageGeometry,
    batches: list[tuple[WarmupSeq, ...]],
    moe_kernel,
    attention_kernels,
) -> float:
    """Run the forward (and the logits of each sequence's last token) once per batch; returns
    the seconds it took. The caller frees the scratch with its own empty_cache()."""
    device, layers = model.device, model.config.num_layers
    bs = geometry.shape.block_size
    kv_per_huge = geometry.huge_page_bytes // geometry.kv_page_bytes
    scratch = UnifiedPool(
        geometry, math.ceil(layers * SCRATCH_BLOCKS / kv_per_huge), model.dtype, device
    )
    scratch.buffer.zero_()  # context never written reads as 0, not as NaN
    experts = OneSlotExperts(host_experts[0], moe_kernel, device)
    runner = model.with_backends(PagedAttention(scratch, kernels=attention_kernels), experts)
    t0 = time.perf_counter()
    for batch in batches:
        slices, start, ids = [], 0, []
        for s in batch:
            context = s.num_computed_tokens + s.num_new_tokens
            n_blocks = math.ceil(context / bs)
            cycle = np.arange(n_blocks, dtype=np.int64) % SCRATCH_BLOCKS
            blocks = cycle[:, None] * layers + np.arange(layers, dtype=np.int64)[None, :]
            slices.append(SequenceSlice(start, s.num_new_tokens, s.num_computed_tokens, blocks))
            ids += [np.arange(s.num_computed_tokens, context)]
            start += s.num_new_tokens
        meta = PagedAttentionMeta.build(slices, layers, bs, device)
        positions = torch.from_numpy(np.concatenate(ids)).to(device)
        tokens = positions % model.config.vocab_size
        hidden = runner.forward(tokens, positions, meta)
        last = torch.tensor([s.start + s.num_new_tokens - 1 for s in slices], device=device)
        runner.compute_logits(hidden[last]).argmax(-1)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0
