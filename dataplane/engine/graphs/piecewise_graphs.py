"""Piecewise CUDA graphs: the steps the decode graphs do not serve (prompt chunks, mixed
prefill and decode batches, contexts past max_seq_len_to_capture) replay one graph per
piece between two attentions, and run only the attentions eagerly in between. This is
vLLM's CUDAGraphMode.PIECEWISE; with the decode graphs it makes FULL_AND_PIECEWISE, the
engine's default (`cudagraph_mode`).

Why: an eager step is host-bound. A step of a 48-layer MoE model launches hundreds of small
kernels, and eager the GPU waits on the host for most of the step (docs/benchmarks.md has
eager against graph step times); without pieces every step with a prompt chunk in it ran
eagerly. Attention stays
outside the graphs because its launch depends on the batch's sequences (their number,
query lengths and block tables); everything else depends only on the token count.

Pieces of a step padded up to a capture size T (L = layers):

    piece 0      embed, input norm, layer 0's q/k/v (projections, q/k norms, RoPE)
    piece l      layer l-1's o proj, residual add + norm, MoE block, add + norm, layer l's q/k/v
    piece L      layer L-1's o proj ... the final norm -> hidden states [T, D]

and between pieces l and l+1, eagerly: layer l's KV write and attention over the step's
real tokens, reading q/k/v from static buffers and writing its output into another.

Invariants the replay relies on:
  - Static per-step inputs (token ids, positions, the rows to count), the buffers that
    cross the eager gaps (q, k, v, attention output) and the hidden states out are
    allocated once, for the largest size, and rewritten in place. Everything else a piece
    allocates lives in the graph pool, shared by all sizes: a size's pieces replay in
    capture order with nothing of another size in between, and no tensor a piece leaves in
    the pool outlives its step. The pool is their own: the memory plan counts it beside the
    decode graphs' (sharing one would save nothing: torch reuses a pool's block only on the
    stream that freed it, and each set captures on its own stream).
  - Padding rows (real tokens .. T) have id 0 and position 0, write no KV (attention sees
    only the real tokens), read whatever an earlier step left in their rows of the
    attention output (finite values: every op is row-wise, so no padding row reaches a real
    one), and are not counted in the routing statistics (MoEBackend.counting_rows, as for
    the decode graphs).
  - Experts: the decode graphs' rule (MoEBackend.graph_safe): device copy-in, or every
    expert resident; the device tables are refreshed in place before each replay.

Known difference from an eager step: the MoE kernel picks its tiles by the padded token
count, so a replayed step may round otherwise than the eager step of the same batch (same
math). The GPU checks require identical fp32 tokens, pieces against eager (gpu_checks.py).
The memory plan counts the driver's own memory per instantiated graph (here up to 40 sizes
x (L + 1) pieces), which `memory_reserved` does not see: priced per piece
(`piece_driver_bytes`); it can be as large as torch's part, so leaving it out would
overcommit the pool.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import torch

from rimuru.dataplane.engine.forward.in_flight import TokenFill
from rimuru.dataplane.engine.forward.paged_attention import PagedAttentionMeta
from rimuru.dataplane.engine.forward.pinned_upload import to_device
from rimuru.dataplane.engine.graphs.cuda_graphs import (
    CaptureCost,
    capture_measured,
    capture_sizes,
    decode_driver_bytes,
)
from rimuru.dataplane.model import MoETransformer

log = logging.getLogger(__name__)


def piecewise_sizes(max_tokens: int) -> tuple[int, ...]:
    """Token counts captured: every 16 up to 256, then steps of 1/8 of the power of two
    below (32 up to 512, 64 up to 1024, ...), and max_tokens itself (max_num_batched_tokens:
    no step is larger). A step pads up to the next size: by at most 15 tokens up to 256,
    by under 1/8 of its tokens beyond 128."""
    sizes, step = set(range(16, min(max_tokens, 256) + 1, 16)), 32
    while step * 8 < max_tokens:
        sizes.update(range(step * 8 + step, min(max_tokens, step * 16) + 1, step))
        step *= 2
    sizes.add(max_tokens)
    return tuple(sorted(sizes))


class PiecewiseGraphs:
    """Static inputs, the pieces' graphs per size, and the eager attention between them
    (module doc). `replay=False` runs the same pieces over the same static, padded inputs
    eagerly: what a CPU can test."""

    def __init__(self, model: MoETransformer, experts, sizes: Sequence[int], *, replay=True):
        self.model, self.experts = model, experts  # experts: MoEBackend (or a scratch one)
        self.sizes = tuple(sorted(sizes))
        self.replay = replay
        cfg, n, device, dtype = model.config, self.sizes[-1], model.device, model.dtype
        # token ids, positions, rows to count (1 = a real token): one copy in per step
        self._inputs = torch.zeros(3, n, dtype=torch.int64, device=device)
        self.ids, self.pos, self.rows = self._inputs
        self.q = torch.zeros(n, cfg.num_heads, cfg.head_dim, dtype=dtype, device=device)
        self.k = torch.zeros(n, cfg.num_kv_heads, cfg.head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.attn = torch.zeros_like(self.q)  # padding rows: 0, or an earlier step's rows
        self.hidden = torch.zeros(n, cfg.hidden_size, dtype=dtype, device=device)
        self._graphs: dict[int, list[torch.cuda.CUDAGraph]] = {}
        self.cost = CaptureCost()  # once captured
        self.steps = 0  # steps served from the static inputs
        self.replays = 0  # of which replayed as graphs

    def size_for(self, num_tokens: int) -> int | None:
        return next((s for s in self.sizes if s >= num_tokens), None)

    def serves(self, num_tokens: int) -> bool:
        return self.size_for(num_tokens) is not None and self.experts.graph_safe()

    def _pieces(self, size: int) -> list[Callable[[], None]]:
        """The L + 1 pieces of a step of `size` tokens, in order. The residual stream and
        RoPE pass from piece to piece through `state`, as they would through the eager
        forward: at capture, what a piece frees the next may reuse, exactly as at replay."""
        model, num_layers = self.model, self.model.config.num_layers
        state: dict[str, object] = {}

        def qkv(layer: int, x: torch.Tensor) -> None:
            for dst, src in zip((self.q, self.k, self.v), model.pre_attention(layer, x, state["rope"]), strict=True):  # fmt: skip
                dst[:size].copy_(src)

        def first() -> None:
            x, state["residual"], state["rope"] = model.embed(self.ids[:size], self.pos[:size])
            qkv(0, x)

        def middle(layer: int) -> None:
            x, state["residual"] = model.post_attention(layer - 1, self.attn[:size], state["residual"])  # fmt: skip
            qkv(layer, x)

        def last() -> None:
            x, _ = model.post_attention(num_layers - 1, self.attn[:size], state["residual"])
            self.hidden[:size].copy_(x)
            state.clear()

        return [first, *(lambda layer=i: middle(layer) for i in range(1, num_layers)), last]

    def capture(self) -> None:
        """All pieces of every size, largest size first, into one graph pool. Inputs are all
        padding while capturing."""
        device = self.model.device
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(device)  # this device's (see cuda_graphs.graph_memory_bytes)
        with torch.inference_mode():
            for size in reversed(self.sizes):
                with self.experts.counting_rows(self.rows[:size]):
                    for piece in self._pieces(size):  # eager first: kernels loaded, allocator warm
                        piece()
                    torch.cuda.synchronize(device)
                    graphs = []
                    for piece in self._pieces(size):
                        graph = torch.cuda.CUDAGraph()
                        with torch.cuda.graph(graph, pool=pool, stream=stream):
                            piece()
                        graphs.append(graph)
                self._graphs[size] = graphs
        torch.cuda.synchronize(device)
        self.experts.reset_routing_counts()  # capture routed padding only; keep no trace

    def run(
        self,
        input_ids: list[int],
        positions: list[int],
        meta: PagedAttentionMeta,
        fill: TokenFill | None = None,
    ):
        """The step's hidden states [len(input_ids), D] (the caller checked `serves`);
        `fill`: tokens of pending rows, taken on the device (async scheduling)."""
        n, size = len(input_ids), self.size_for(len(input_ids))
        assert size is not None
        inputs = torch.zeros_like(self._inputs, device="cpu")  # padding: id 0, position 0
        inputs[0, :n] = torch.tensor(input_ids, dtype=torch.int64)
        inputs[1, :n] = torch.tensor(positions, dtype=torch.int64)
        inputs[2, :n] = 1
        self._inputs.copy_(to_device(inputs, self._inputs.device))  # not a pageable copy
        if fill is not None:
            fill.apply(self._inputs[0])
        # as for the decode graphs: only an eager MoE call refreshes the expert tables
        self.experts.refresh_device_tables()
        self.steps += 1
        graphs = self._graphs.get(size) if self.replay else None
        if graphs is not None:
            self.replays += 1
            pieces: list[Callable] = [g.replay for g in graphs]
        else:
            pieces = self._pieces(size)
        attention = self.model.attention
        with self.experts.counting_rows(self.rows[:size]), torch.inference_mode():
            for layer, piece in enumerate(pieces[:-1]):
                piece()
                out = attention.attend(layer, self.q[:n], self.k[:n], self.v[:n], meta)
                self.attn[:n].copy_(out)
            pieces[-1]()
        return self.hidden[:n]


# The driver's memory per instantiated piece (cuda_graphs.DRIVER_BYTES_PER_GRAPH_LAYER says
# why it is priced, not measured). It must stay above what capture is seen to take per piece
# for the presets' pieces (the engine logs planned against taken), with margin.
DRIVER_BYTES_PER_PIECE = 256 * 1024


def piece_driver_bytes(num_sizes: int, num_layers: int) -> int:
    """The driver's memory the plan sets aside for the pieces (L + 1 per size)."""
    return num_sizes * (num_layers + 1) * DRIVER_BYTES_PER_PIECE


def graph_driver_bytes(
    num_layers: int, max_num_seqs: int, max_num_batched_tokens: int
) -> tuple[int, int]:
    """The driver's memory priced for an engine's decode graphs and its pieces, before the
    plan's 10% headroom (graph_setup.py adds it, with the graphs' pools)."""
    decode = decode_driver_bytes(len(capture_sizes(max_num_seqs)), num_layers)
    pieces = piece_driver_bytes(len(piecewise_sizes(max_num_batched_tokens)), num_layers)
    return decode, pieces


def piecewise_memory_bytes(model: MoETransformer, experts, size: int) -> int:
    """Device memory piecewise graphs up to `size` tokens keep: static buffers and the pool
    of the largest size's pieces, measured by capturing them over `model` (the profiling
    scratch: same kernels, same shapes), then released. Smaller sizes reuse that pool."""
    device = model.device
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    before = torch.cuda.memory_reserved(device)
    PiecewiseGraphs(model, experts, (size,)).capture()
    used = torch.cuda.memory_reserved(device) - before  # the graphs are gone again
    torch.cuda.empty_cache()
    return int(used)


def build_piecewise_graphs(
    model: MoETransformer,
    experts,  # MoEBackend
    sizes: Sequence[int],
    *,
    capture: bool = True,
    planned_bytes: int = 0,
) -> PiecewiseGraphs | None:
    """Piecewise graphs over the engine's model, captured; None (those steps stay eager)
    when capture fails. capture=False keeps the static inputs and runs the pieces eagerly
    (what a CPU can test)."""
    if not capture:
        return PiecewiseGraphs(model, experts, sizes, replay=False)
    try:
        graphs = capture_measured(model.device, lambda: PiecewiseGraphs(model, experts, sizes))
    except Exception:  # serving eagerly beats not serving; the log says why
        log.exception("piecewise CUDA graphs: capture failed, those steps run eagerly")
        return None
    cost = graphs.cost
    log.info(
        "piecewise CUDA graphs: %d sizes (16..%d tokens) x %d pieces captured in %.1f s, "
        "%.1f MiB held (planned %.1f MiB with the decode graphs); device free memory fell "
        "by %.1f MiB",
        len(graphs.sizes), graphs.sizes[-1], model.config.num_layers + 1, cost.seconds,
        cost.held_bytes / 2**20, planned_bytes / 2**20, cost.free_drop_bytes / 2**20,
    )  # fmt: skip
    return graphs
