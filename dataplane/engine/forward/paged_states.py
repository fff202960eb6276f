"""Gated DeltaNet states in the pool: the engine's StateBackend for hybrid models.

Each running request holds, per GDN layer, one SSM page (fp32 [Hv, Dk, Dv]: the recurrent
state) and one conv page ([Cc, K - 1] in the weights' dtype: the conv's last inputs); see
kv_cache.py for when they are taken and released. A step reads every scheduled sequence's
states from its pages and writes the new ones back in place, so a prompt split into
chunks, and then decode, continues exactly where it stopped. A request's pages are zeroed
before its first token (`StateMeta.build` lists them; `begin_step` zeroes): a request
preempted and re-admitted starts again from zeros on fresh pages.

Two paths, chosen once (compute_paths.py): the torch references per sequence
(dataplane/model/hybrid/gated_delta.py, causal_conv.py) on the CPU, and on CUDA the Triton kernels
of `rimuru.kernels` that address states by page id, with the chunked prefill of fla-core's
`chunk_gated_delta_rule` (gathering and scattering the states of the step's prefilling
sequences) when fla-core is installed, else the torch chunked form per sequence.

Shape key: T = tokens of the step, S = its sequences, G = GDN layers, Hk/Hv, Dk/Dv as in
model/linear_attention.py, Cc = conv channels, K = conv kernel.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rimuru.dataplane.engine.forward.pinned_upload import to_device
from rimuru.dataplane.memory.geometry import PageType
from rimuru.dataplane.memory.pool import UnifiedPool
from rimuru.dataplane.memory.tables import StatePages
from rimuru.dataplane.model.hybrid import gated_delta
from rimuru.dataplane.model.hybrid.causal_conv import causal_conv1d
from rimuru.dataplane.model.linear_attention import LinearAttentionConfig


@dataclass(frozen=True)
class StepPart:
    """The sequences of a step one kernel serves: decode (one new token each) or prefill."""

    rows: torch.Tensor | None  # [T'] their rows of the flattened batch; None = every row
    ssm_pages: torch.Tensor  # [G, S'] int64
    conv_pages: torch.Tensor  # [G, S'] int64
    cu_seqlens: torch.Tensor  # [S' + 1] int32 over their rows
    # The same offsets for fla-core's chunked rule (prefill only): int64 on the device, one
    # object for every layer of the step, and on the host. fla caches what it derives from
    # them by tensor identity and reads the host copy instead of syncing on the device's.
    cu_seqlens_long: torch.Tensor | None = None
    cu_seqlens_host: torch.Tensor | None = None


@dataclass(frozen=True)
class StateMeta:
    """One step's sequences as the state backend sees them."""

    starts: tuple[int, ...]  # [S] first row of each sequence in the flattened batch
    lengths: tuple[int, ...]  # [S] its new tokens
    ssm_pages: torch.Tensor  # [G, S] int64, on the device
    conv_pages: torch.Tensor  # [G, S] int64
    cu_seqlens: torch.Tensor  # [S + 1] int32, on the device
    fresh: torch.Tensor  # [G * n] int64: SSM pages to zero, then the conv pages' (same n)
    num_fresh: int  # n: sequences starting from their first token
    decode: StepPart | None  # the one-token sequences (kernel path)
    prefill: StepPart | None  # the others

    @classmethod
    def build(
        cls,
        pages: Sequence[StatePages],
        starts: Sequence[int],
        lengths: Sequence[int],
        fresh: Sequence[bool],
        device: torch.device,
    ) -> StateMeta:
        ssm = torch.tensor([p.ssm for p in pages], dtype=torch.int64).T.contiguous()  # [G, S]
        conv = torch.tensor([p.conv for p in pages], dtype=torch.int64).T.contiguous()
        new = [i for i, f in enumerate(fresh) if f]
        to_zero = torch.cat((ssm[:, new].reshape(-1), conv[:, new].reshape(-1)))
        one = [i for i, n in enumerate(lengths) if n == 1]
        more = [i for i, n in enumerate(lengths) if n > 1]

        def part(seqs: list[int], prefill: bool) -> StepPart | None:
            if not seqs:
                return None
            every = len(seqs) == len(lengths)
            rows = [r for i in seqs for r in range(starts[i], starts[i] + lengths[i])]
            cu = [0, *itertools.accumulate(lengths[i] for i in seqs)]
            cu_host = torch.tensor(cu, dtype=torch.int64)
            return StepPart(
                None if every else to_device(torch.tensor(rows, dtype=torch.int64), device),
                to_device(ssm[:, seqs].contiguous(), device),
                to_device(conv[:, seqs].contiguous(), device),
                to_device(cu_host.to(torch.int32), device),
                to_device(cu_host, device) if prefill else None, cu_host if prefill else None,
            )  # fmt: skip

        cu = [0, *itertools.accumulate(lengths)]
        return cls(
            tuple(starts), tuple(lengths), to_device(ssm, device), to_device(conv, device),
            to_device(torch.tensor(cu, dtype=torch.int32), device),
            to_device(to_zero, device), len(new), part(one, prefill=False), part(more, prefill=True),
        )  # fmt: skip


@dataclass(frozen=True)
class HybridStepMeta:
    """What a hybrid model's forward passes its backends (model/hybrid/transformer.py)."""

    attention: object  # PagedAttentionMeta
    states: StateMeta


class PagedStates:
    """StateBackend over the pool's SSM and conv pages."""

    def __init__(self, pool: UnifiedPool, gdn: LinearAttentionConfig, use_kernels: bool):
        ssm_bytes = pool.view(PageType.SSM)  # [P, content] uint8, page stride = slot
        conv_bytes = pool.view(PageType.CONV)
        self.ssm = ssm_bytes.view(torch.float32).view(-1, *gdn.ssm_state_shape)  # [P, Hv, Dk, Dv]
        self.conv_states = conv_bytes.view(pool.dtype).view(-1, *gdn.conv_state_shape)
        self.use_kernels = use_kernels
        if use_kernels:  # resolved once, not per layer of every step
            from rimuru.kernels import causal_conv_decode, causal_conv_prefill, gated_delta_decode

            self._conv_decode, self._conv_prefill = causal_conv_decode, causal_conv_prefill
            self._rule_decode = gated_delta_decode
        cuda = pool.device.type == "cuda"  # fla's kernels are not for the interpreter
        self._chunk_prefill = _fla_chunk_prefill() if use_kernels and cuda else None

    def begin_step(self, meta: StateMeta) -> None:
        """Zero the pages of sequences that start this step (their states begin at zero)."""
        if meta.num_fresh:
            num_ssm = meta.fresh.numel() // 2
            self.ssm.index_fill_(0, meta.fresh[:num_ssm], 0.0)
            self.conv_states.index_fill_(0, meta.fresh[num_ssm:], 0)

    def conv(self, gdn_layer: int, x, weight, meta: StateMeta) -> torch.Tensor:
        if self.use_kernels:

            def decode(part: StepPart, x):
                return self._conv_decode(x, weight, self.conv_states, part.conv_pages[gdn_layer])

            def prefill(part: StepPart, x):
                pages = part.conv_pages[gdn_layer]
                return self._conv_prefill(x, weight, self.conv_states, pages, part.cu_seqlens)

            return _by_part(meta, x, x, decode, prefill)
        pages = meta.conv_pages[gdn_layer]
        out = torch.empty_like(x)
        for page, start, n in zip(pages.tolist(), meta.starts, meta.lengths, strict=True):
            rows = slice(start, start + n)
            if page < 0:  # a padding row (decode graphs' static inputs): no state
                out[rows] = 0
                continue
            out[rows], self.conv_states[page] = causal_conv1d(
                x[rows], weight, self.conv_states[page]
            )
        return out

    def delta_rule(self, gdn_layer: int, q, k, v, g, beta, meta: StateMeta) -> torch.Tensor:
        if self.use_kernels and (meta.prefill is None or self._chunk_prefill is not None):

            def decode(part: StepPart, q, k, v, g, beta):
                pages = part.ssm_pages[gdn_layer]
                return self._rule_decode(q, k, v, g, beta, self.ssm, pages)

            def prefill(part: StepPart, q, k, v, g, beta):
                pages = part.ssm_pages[gdn_layer]
                return self._chunk_prefill(q, k, v, g, beta, self.ssm, pages, part)

            return _by_part(meta, v, (q, k, v, g, beta), decode, prefill)
        pages = meta.ssm_pages[gdn_layer]
        out = torch.empty_like(v)
        for page, start, n in zip(pages.tolist(), meta.starts, meta.lengths, strict=True):
            rows = slice(start, start + n)
            if page < 0:
                out[rows] = 0
                continue
            rule = gated_delta.recurrent if n == 1 else gated_delta.chunked
            out[rows], self.ssm[page] = rule(
                q[rows], k[rows], v[rows], g[rows], beta[rows], self.ssm[page].clone()
            )
        return out


def _by_part(meta: StateMeta, like: torch.Tensor, inputs, decode, prefill) -> torch.Tensor:
    """Run the decode kernel on the step's one-token sequences and the prefill one on the
    rest, each over its own rows; the output [T, ...] shaped like `like`."""
    many = isinstance(inputs, tuple)
    parts = [(p, fn) for p, fn in ((meta.decode, decode), (meta.prefill, prefill)) if p]
    if len(parts) == 1 and parts[0][0].rows is None:  # one kind of sequence: no gathers
        part, fn = parts[0]
        return fn(part, *inputs) if many else fn(part, inputs)
    out = torch.empty_like(like)
    for part, fn in parts:
        picked = tuple(t[part.rows] for t in inputs) if many else inputs[part.rows]
        out[part.rows] = fn(part, *picked) if many else fn(part, picked)
    return out


def _fla_chunk_prefill():
    """fla-core's chunked gated delta rule over the step's sequences (varlen), states
    gathered from and scattered back to their pages; None when fla-core is absent."""
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except ImportError:
        return None

    def prefill(q, k, v, g, beta, states, pages, part: StepPart) -> torch.Tensor:
        dtype = v.dtype
        out, final = chunk_gated_delta_rule(
            q.to(dtype)[None], k.to(dtype)[None], v[None], g[None], beta.to(dtype)[None],
            initial_state=states[pages], output_final_state=True,
            cu_seqlens=part.cu_seqlens_long, cu_seqlens_cpu=part.cu_seqlens_host,
        )  # fmt: skip
        states[pages] = final
        return out[0]

    return prefill
