"""One rank's slice of a model under tensor parallelism (vLLM's layout).

    attention   q, k, v rows of this rank's heads (column parallel: the engine fuses them
                into one qkv_proj after slicing, so the fused matrix is this rank's too);
                o_proj the matching columns (row parallel: a partial sum, all-reduced).
                With fewer KV heads than ranks each KV head is replicated on TP/Hkv
                ranks (vLLM's num_kv_head_replicas): rank r holds KV head r*Hkv//TP,
                the one its query heads attend with, and caches it
    experts     every routed expert cut along its intermediate dimension I: w1 and w3 rows,
                w2 columns, so one expert page on a rank holds I/TP x D elements
    shared      the shared expert and dense MLPs cut the same way; the shared expert's
                sigmoid gate is a scalar per token, so it scales the partial sum alike
    replicated  embedding, LM head, norms, routers (every rank routes every token the
                same way: its input is the all-reduced residual stream)
    hybrids     gated attention as attention (its output gate's rows with q's); a Gated
                DeltaNet layer by key heads, each with its value heads (value head j of key
                head h sits at h*G + j, so a rank's value heads are contiguous too): the q,
                k and v rows of qkv_proj and the conv, z/b/a rows, dt_bias and A_log, and
                out_proj's columns. A rank's recurrent and conv states are its heads' only

A rank's `ModelConfig` is the model with TP-times fewer heads (KV heads: max(1, Hkv/TP))
and TP-times narrower experts: everything downstream (page geometry, memory plan, KV pages,
`rimuru plan -tp`) then sizes itself per rank with no further change, replicated KV heads
included. Sums of slices equal the whole to float rounding only.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from rimuru.dataplane.model.config import ModelConfig
from rimuru.dataplane.model.hybrid.weights import (
    GatedAttentionWeights,
    GatedDeltaNetWeights,
    HybridLayerWeights,
)
from rimuru.dataplane.model.weights import (
    AttentionWeights,
    ExpertWeights,
    GlobalWeights,
    LayerWeights,
    WeightSource,
    host_empty,
)


@dataclass(frozen=True)
class TensorShard:
    rank: int
    size: int  # TP, the number of ranks

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.size:
            raise ValueError(f"rank {self.rank} is outside 0..{self.size - 1}")

    def rows(self, t: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """This rank's contiguous 1/TP of `t` along `dim`."""
        n = t.shape[dim] // self.size
        return t.narrow(dim, self.rank * n, n).contiguous()

    def kv_heads(self, t: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
        """This rank's KV heads of `t` (rows of `num_kv_heads` whole heads): its 1/TP of them,
        or with fewer heads than ranks the one head ranks r*Hkv//TP share. Either way they
        are the heads its query heads (rows(q)) attend with: query head h reads KV head
        h // (Hq/Hkv), and a rank's Hq/TP query heads fall in one group when TP >= Hkv."""
        per_rank = num_kv_heads_per_rank(num_kv_heads, self.size)
        n = t.shape[0] // num_kv_heads  # rows of one head
        first = self.rank * num_kv_heads // self.size
        return t.narrow(0, first * n, per_rank * n).contiguous()


def num_kv_heads_per_rank(num_kv_heads: int, size: int) -> int:
    """KV heads a rank holds and caches: Hkv/TP, or one (replicated) when TP > Hkv."""
    return max(1, num_kv_heads // size)


def check_shardable(mc: ModelConfig, size: int) -> None:
    """Raise ValueError, saying which size does not divide, unless `size` ranks can split it."""
    if size < 1:
        raise ValueError(f"--tensor-parallel-size must be >= 1, got {size}")
    if mc.quant is not None and size > 1:
        # Each rank's experts would be a slice of the 128-row scale blocks: not built yet.
        raise ValueError(
            f"--tensor-parallel-size {size} with a block-FP8 ({mc.quant}) model is not "
            f"supported yet: serve it on one GPU (--tensor-parallel-size 1)"
        )
    bad = _unshardable(mc, size)
    if bad:
        fits = [n for n in range(1, mc.num_heads + 1) if not _unshardable(mc, n)]
        raise ValueError(
            f"--tensor-parallel-size {size} must divide the model's {', '.join(bad)}: "
            f"choose a size that does (sizes that fit this model: {fits})"
        )


def _unshardable(mc: ModelConfig, size: int) -> list[str]:
    """The model's sizes that `size` ranks cannot split, as "name value" (with why, for KV)."""
    sizes = {
        "num_attention_heads": mc.num_heads,
        "moe_intermediate_size": mc.moe_intermediate_size,
        "shared_expert_intermediate_size": mc.shared_expert_intermediate_size,
        "intermediate_size (dense layers)": mc.dense_intermediate_size,
    }
    if mc.linear_attention is not None:
        sizes["linear_num_key_heads"] = mc.linear_attention.num_key_heads
    bad = [f"{name} {value}" for name, value in sizes.items() if value % size]
    kv = mc.num_kv_heads
    # vLLM's rule: the ranks split the KV heads, or each head is held by the same number of
    # ranks (TP a multiple of Hkv); 3 heads on 2 ranks is neither.
    if kv % size and size % kv:
        bad.append(
            f"num_key_value_heads {kv}, or be a multiple of it (fewer KV heads than ranks are "
            f"replicated, each on TP/{kv} ranks, as vLLM does)"
        )
    return bad


def shard_config(mc: ModelConfig, size: int) -> ModelConfig:
    """The model as one of `size` ranks sees it."""
    check_shardable(mc, size)
    gdn = mc.linear_attention
    if gdn is not None:  # value heads follow their key heads (G per key head)
        gdn = dataclasses.replace(
            gdn, num_key_heads=gdn.num_key_heads // size,
            num_value_heads=gdn.num_value_heads // size,
        )  # fmt: skip
    return mc.replace(
        linear_attention=gdn,
        num_heads=mc.num_heads // size,
        num_kv_heads=num_kv_heads_per_rank(mc.num_kv_heads, size),
        moe_intermediate_size=mc.moe_intermediate_size // size,
        shared_expert_intermediate_size=mc.shared_expert_intermediate_size // size,
        dense_intermediate_size=mc.dense_intermediate_size // size,
    )


class ShardedWeights:
    """A WeightSource handing out one rank's slices of another source's tensors."""

    def __init__(self, source: WeightSource, shard: TensorShard):
        self.source = source
        self.shard = shard
        self._config = shard_config(source.config, shard.size)

    @property
    def config(self) -> ModelConfig:
        return self._config

    def global_weights(self, device: torch.device, dtype: torch.dtype) -> GlobalWeights:
        return self.source.global_weights(device, dtype)  # replicated

    def layer_weights(self, layer: int, device: torch.device, dtype: torch.dtype) -> LayerWeights:
        w = self.source.layer_weights(layer, device, dtype)
        mlps = {
            name: self._gated_mlp(m)
            for name, m in (("shared_expert", w.shared_expert), ("dense_mlp", w.dense_mlp))
            if m is not None
        }
        if isinstance(w, HybridLayerWeights):
            return dataclasses.replace(w, mixer=self._mixer(w.mixer), **mlps)
        return dataclasses.replace(w, attention=self._attention(w.attention), **mlps)

    def _mixer(self, m: GatedAttentionWeights | GatedDeltaNetWeights):
        s = self.shard
        if isinstance(m, GatedAttentionWeights):
            num_kv = self.source.config.num_kv_heads
            return dataclasses.replace(
                m, q_proj=s.rows(m.q_proj), gate_proj=s.rows(m.gate_proj),
                k_proj=s.kv_heads(m.k_proj, num_kv), v_proj=s.kv_heads(m.v_proj, num_kv),
                o_proj=s.rows(m.o_proj, 1),
            )  # fmt: skip
        gdn = self.source.config.linear_attention
        segments = [gdn.key_size, gdn.key_size, gdn.value_size]  # q, k, v: the conv's channels

        def channels(t: torch.Tensor) -> torch.Tensor:
            return torch.cat([s.rows(part) for part in t.split(segments)])

        return dataclasses.replace(
            m, qkv_proj=channels(m.qkv_proj), conv_weight=channels(m.conv_weight),
            z_proj=s.rows(m.z_proj), b_proj=s.rows(m.b_proj), a_proj=s.rows(m.a_proj),
            dt_bias=s.rows(m.dt_bias), a_log=s.rows(m.a_log), out_proj=s.rows(m.out_proj, 1),
        )  # fmt: skip

    def _gated_mlp(self, m):
        """A shared expert or dense MLP: gate and up rows, down columns (the shared
        expert's sigmoid gate is a scalar per token: replicated)."""
        s = self.shard
        return dataclasses.replace(
            m, gate_proj=s.rows(m.gate_proj), up_proj=s.rows(m.up_proj),
            down_proj=s.rows(m.down_proj, 1),
        )  # fmt: skip

    def _attention(self, a: AttentionWeights) -> AttentionWeights:
        s, num_kv_heads = self.shard, self.source.config.num_kv_heads

        def q(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else s.rows(t)  # whole heads: Dh divides the slice

        def kv(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else s.kv_heads(t, num_kv_heads)

        return dataclasses.replace(
            a,
            q_proj=q(a.q_proj), k_proj=kv(a.k_proj), v_proj=kv(a.v_proj),
            q_bias=q(a.q_bias), k_bias=kv(a.k_bias), v_bias=kv(a.v_bias),
            o_proj=s.rows(a.o_proj, 1),
            # added once to the sum, not once per rank
            o_bias=a.o_bias if s.rank == 0 else None,
        )  # fmt: skip

    def expert_weights(
        self,
        moe_layer: int,
        dtype: torch.dtype,
        *,
        pin_memory: bool = False,
        work_device: torch.device | None = None,
    ) -> ExpertWeights:
        whole = self.source.expert_weights(moe_layer, dtype, work_device=work_device)
        s = self.shard

        def host(t: torch.Tensor) -> torch.Tensor:
            out = host_empty(tuple(t.shape), dtype, pin_memory)
            return out.copy_(t)

        return ExpertWeights(
            w1=host(s.rows(whole.w1, 1)), w3=host(s.rows(whole.w3, 1)), w2=host(s.rows(whole.w2, 2))
        )
