"""Dense reference backends: the oracle the paged engine is compared against.

`DenseExperts` keeps every routed expert in contiguous tensors and loops over the experts
hit, the same math as transformers. `ContiguousKVAttention` keeps each sequence's K/V as one
growing tensor per layer and attends causally with scaled-dot-product attention.

Shape key: T = tokens of the step, N = new tokens of one sequence, L = its cached + new
tokens, Hq/Hkv = heads, Dh = head dim, D = hidden, K = experts per token, E = experts.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rimuru.dataplane.model.block_fp8 import dequantize
from rimuru.dataplane.model.weights import ExpertWeights


class DenseExperts:
    """ExpertBackend over all layers' experts, copied to `device` once (block-FP8 experts
    with their scales, dequantized per expert as the engine's torch MoE does)."""

    def __init__(
        self, experts: Sequence[ExpertWeights], device: torch.device | str = "cpu"
    ) -> None:
        def moved(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device)

        self._layers = [
            ExpertWeights(
                *(moved(t) for t in (e.w1, e.w3, e.w2, e.w1_scale, e.w3_scale, e.w2_scale))
            )
            for e in experts
        ]

    def moe(
        self, layer: int, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor
    ) -> torch.Tensor:
        w = self._layers[layer]
        out = torch.zeros_like(x)  # [T, D]
        # One pass per expert hit; (token, slot) pairs routed to it come out of nonzero().
        for e in torch.unique(topk_ids).tolist():
            tokens, slots = torch.nonzero(topk_ids == e, as_tuple=True)
            xe = x[tokens]  # [n, D]
            w1, w3, w2 = w.expert(e)
            if w.is_fp8:
                pairs = zip(w.expert(e), w.scales(e), strict=True)
                w1, w3, w2 = (dequantize(m, s, x.dtype) for m, s in pairs)
            h = F.silu(F.linear(xe, w1)) * F.linear(xe, w3)  # [n, I]
            ye = F.linear(h, w2) * topk_weights[tokens, slots, None]  # [n, D] fp32
            # index_put_ rather than index_add_: same sums, far faster on CPU.
            out.index_put_((tokens,), ye.to(x.dtype), accumulate=True)
        return out


@dataclass(frozen=True)
class SequenceChunk:
    """`num_new_tokens` consecutive tokens of sequence `seq_id` in the flattened batch."""

    seq_id: Hashable
    num_new_tokens: int


@dataclass(frozen=True)
class ContiguousKVMeta:
    """Batch order of a step: chunks appear in the order their tokens are concatenated."""

    chunks: tuple[SequenceChunk, ...]

    @classmethod
    def of(cls, pairs: Sequence[tuple[Hashable, int]]) -> ContiguousKVMeta:
        """From [(seq_id, num_new_tokens), ...]."""
        return cls(tuple(SequenceChunk(s, n) for s, n in pairs))

    @property
    def num_tokens(self) -> int:
        return sum(c.num_new_tokens for c in self.chunks)


class ContiguousKVAttention:
    """AttentionBackend that appends each sequence's K/V to one tensor per (layer, sequence).

    A sequence's new tokens sit at the end of its history, so token i of N new ones sees the
    L - N cached keys plus new keys 0..i (the causal mask is offset by L - N)."""

    def __init__(self) -> None:
        self._kv: dict[tuple[int, Hashable], tuple[torch.Tensor, torch.Tensor]] = {}

    def num_cached_tokens(self, seq_id: Hashable, layer: int = 0) -> int:
        kv = self._kv.get((layer, seq_id))
        return 0 if kv is None else kv[0].shape[0]

    def free(self, seq_id: Hashable) -> None:
        """Forget a finished (or preempted) sequence on every layer."""
        for key in [k for k in self._kv if k[1] == seq_id]:
            del self._kv[key]

    def attend(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        meta: ContiguousKVMeta,
    ) -> torch.Tensor:
        if meta.num_tokens != q.shape[0]:
            raise ValueError(
                f"meta covers {meta.num_tokens} tokens but the step has {q.shape[0]}; build it "
                f"with one (seq_id, num_new_tokens) per sequence, in batch order"
            )
        if len({c.seq_id for c in meta.chunks}) != len(meta.chunks):
            raise ValueError("a sequence appears twice in one step; give each one chunk")
        outs = []
        start = 0
        for chunk in meta.chunks:
            end = start + chunk.num_new_tokens
            outs.append(
                self._attend_one(layer, chunk.seq_id, q[start:end], k[start:end], v[start:end])
            )
            start = end
        return torch.cat(outs, dim=0)  # [T, Hq, Dh]

    def _attend_one(
        self, layer: int, seq_id: Hashable, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        cached = self._kv.get((layer, seq_id))
        if cached is not None:
            k = torch.cat((cached[0], k), dim=0)  # [L, Hkv, Dh]
            v = torch.cat((cached[1], v), dim=0)
        self._kv[(layer, seq_id)] = (k, v)
        num_new, num_all = q.shape[0], k.shape[0]
        # mask[i, j]: new token i (at L - N + i) may see key j.
        mask = torch.ones(num_new, num_all, dtype=torch.bool, device=q.device).tril(
            num_all - num_new
        )
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1),  # [Hq, N, Dh]
            k.transpose(0, 1),  # [Hkv, L, Dh]
            v.transpose(0, 1),
            attn_mask=mask,
            enable_gqa=q.shape[1] != k.shape[1],
        )
        return out.transpose(0, 1)  # [N, Hq, Dh]
