"""Attention over the pool's KV pages: the engine's AttentionBackend.

Per step the engine builds a `PagedAttentionMeta`: for every layer a slot mapping (where
each new token's K/V goes: slot = page * 16 + offset) and each sequence's block table
(its pages of that layer, in logical order), both gathered on the device from the
persistent block tables (block_table_store.py). The torch reference path writes K/V into the
pool's KV view and attends by gathering pages through the block table; on CUDA the
Triton kernels of `rimuru.kernels` plug in behind the same interface.

Shape key: T = tokens of the step, Hq/Hkv = heads, Dh = head dim, B = block size (16),
N = new tokens of one sequence, C = its context (cached + new) tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from rimuru.dataplane.engine.forward.block_table_store import DeviceBlockTables
from rimuru.dataplane.memory.geometry import PageType
from rimuru.dataplane.memory.pool import UnifiedPool
from rimuru.dataplane.memory.tables import BlockTable


@dataclass(frozen=True)
class SequenceSlice:
    start: int  # first token of this sequence in the flattened batch
    num_new_tokens: int  # N
    num_computed_tokens: int  # tokens already cached before this step
    table: BlockTable  # its KV pages, [num_blocks, L]; the device's copy is gathered from

    @property
    def context_len(self) -> int:
        return self.num_computed_tokens + self.num_new_tokens


@dataclass(frozen=True)
class PagedAttentionMeta:
    sequences: tuple[SequenceSlice, ...]
    slot_mapping: torch.Tensor  # [L, T] int64
    # kernel inputs, on the device (built once per step, shared by all layers)
    block_tables: torch.Tensor  # [L, S, max_blocks] int32
    cu_seqlens_q: torch.Tensor  # [S + 1] int32
    seq_lens: torch.Tensor  # [S] int32 (cached + new)
    max_query_len: int
    max_seq_len: int

    @classmethod
    def build(cls, sequences: list[SequenceSlice], tables: DeviceBlockTables) -> PagedAttentionMeta:
        """The sequences' new blocks written into the device's block tables, then the
        step's tables and slots gathered there from a few vectors (block_table_store.py)."""
        rows = tables.assign([s.table for s in sequences])
        lengths = [s.num_new_tokens for s in sequences]
        num_seqs, num_tokens = len(sequences), sum(lengths)
        host = np.concatenate((
            rows,  # [S]
            np.concatenate(([0], np.cumsum(lengths))),  # [S + 1] cu_seqlens_q
            [s.context_len for s in sequences],  # [S] seq_lens
            np.repeat(rows, lengths),  # [T] each token's row
            np.concatenate([np.arange(s.num_computed_tokens, s.context_len) for s in sequences]),
        )).astype(np.int32)  # fmt: skip
        seq_rows, cu, seq_lens, token_rows, pos = torch.split(
            tables.upload(host), [num_seqs, num_seqs + 1, num_seqs, num_tokens, num_tokens]
        )
        return cls(
            tuple(sequences),
            tables.slot_mapping(token_rows, pos),  # [L, T]
            tables.gather_tables(seq_rows, max(len(s.table) for s in sequences)),  # [L, S, B]
            cu,
            seq_lens,
            max(lengths),
            max(s.context_len for s in sequences),
        )


def triton_attend(layer, q, k, v, meta: PagedAttentionMeta, kv: torch.Tensor, scale: float):
    """The CUDA path: KV write, then decode (one query per sequence) or prefill kernels."""
    from rimuru.kernels import paged_decode_attention, paged_prefill_attention, write_kv_pages

    write_kv_pages(k, v, kv, meta.slot_mapping[layer])
    tables = meta.block_tables[layer]
    if meta.max_query_len == 1:
        return paged_decode_attention(q, kv, tables, meta.seq_lens, meta.max_seq_len, scale=scale)
    return paged_prefill_attention(
        q, kv, tables, meta.cu_seqlens_q, meta.seq_lens, meta.max_query_len, scale=scale
    )


class PagedAttention:
    def __init__(
        self,
        pool: UnifiedPool,
        scale: float | None = None,
        kernels: dict[str, Callable] | None = None,
    ):
        self.pool = pool
        shape = pool.geometry.shape
        self.block_size = shape.block_size
        self.scale = scale if scale is not None else 1.0 / math.sqrt(shape.head_dim)
        self.kernels = kernels

    def attend(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        meta: PagedAttentionMeta,
    ) -> torch.Tensor:
        kv = self.pool.view(PageType.KV)  # [P, 2, B, Hkv, Dh]
        if self.kernels is not None:
            return self.kernels["attend"](layer, q, k, v, meta, kv, self.scale)
        slots = meta.slot_mapping[layer]  # [T]; a negative slot writes nothing (padding)
        keep = slots >= 0
        if not bool(keep.all()):
            slots, k, v = slots[keep], k[keep], v[keep]
        pages, offsets = slots // self.block_size, slots % self.block_size
        kv[pages, 0, offsets] = k
        kv[pages, 1, offsets] = v
        if meta.max_query_len == 1:
            return self._decode_batched(layer, q, kv, meta)
        out = torch.empty_like(q)  # [T, Hq, Dh]
        group = q.shape[1] // k.shape[1]
        for i, s in enumerate(meta.sequences):
            num_blocks = math.ceil(s.context_len / self.block_size)
            table = meta.block_tables[layer, i, :num_blocks].long()  # [num_blocks]
            ctx_k = kv[table, 0].reshape(-1, *kv.shape[3:])[: s.context_len]  # [C, Hkv, Dh]
            ctx_v = kv[table, 1].reshape(-1, *kv.shape[3:])[: s.context_len]
            qs = q[s.start : s.start + s.num_new_tokens]  # [N, Hq, Dh]
            out[s.start : s.start + s.num_new_tokens] = _causal_attention(
                qs, ctx_k, ctx_v, s.num_computed_tokens, group, self.scale
            )
        return out

    def _decode_batched(self, layer, q, kv, meta: PagedAttentionMeta) -> torch.Tensor:
        """Every sequence has one new token: one padded SDPA over all of them.

        q [S, Hq, Dh]; context gathered through the block tables to [S, C, Hkv, Dh] with
        C = max_blocks * 16, positions past each sequence's length masked out."""
        tables = meta.block_tables[layer].to(torch.int64)  # [S, maxb]
        num_seqs, max_blocks = tables.shape
        ctx = kv[tables]  # [S, maxb, 2, B, Hkv, Dh]
        ctx_k = ctx[:, :, 0].reshape(num_seqs, max_blocks * self.block_size, *kv.shape[3:])
        ctx_v = ctx[:, :, 1].reshape(num_seqs, max_blocks * self.block_size, *kv.shape[3:])
        keys = torch.arange(ctx_k.shape[1], device=q.device)  # [C]
        mask = keys[None, :] < meta.seq_lens.to(q.device)[:, None]  # [S, C]
        # Padding reads pages nobody wrote (the pool is uninitialised): zero them, since a
        # masked score of NaN stays NaN and 0 * NaN in the value sum is NaN too.
        hidden = ~mask[:, :, None, None]
        ctx_k = ctx_k.masked_fill(hidden, 0.0)
        ctx_v = ctx_v.masked_fill(hidden, 0.0)
        group = q.shape[1] // kv.shape[3]
        out = F.scaled_dot_product_attention(
            q[:, :, None, :],  # [S, Hq, 1, Dh]
            ctx_k.repeat_interleave(group, dim=2).transpose(1, 2),  # [S, Hq, C, Dh]
            ctx_v.repeat_interleave(group, dim=2).transpose(1, 2),
            attn_mask=mask[:, None, None, :],
            scale=self.scale,
        )  # [S, Hq, 1, Dh]
        return out[:, :, 0, :]


def _causal_attention(q, k, v, offset: int, group: int, scale: float) -> torch.Tensor:
    """q [N, Hq, Dh] at positions offset..offset+N-1 over k/v [C, Hkv, Dh] -> [N, Hq, Dh]."""
    n, c = q.shape[0], k.shape[0]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    positions = torch.arange(offset, offset + n, device=q.device)[:, None]
    mask = torch.arange(c, device=q.device)[None, :] <= positions  # [N, C]
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask, scale=scale
    )  # [Hq, N, Dh]
    return out.transpose(0, 1)
