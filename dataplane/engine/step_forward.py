"""One step's forward: the scheduled requests flattened into one batch (vLLM style), and the
path that runs it. A decode-only step the decode graphs can take replays one (cuda_graphs.py);
any other step the piecewise graphs can take replays those (piecewise_graphs.py); the rest
run the model eagerly. All three give the same math (the GPU checks compare tokens). What
the forward produced is read back by in_flight.py."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rimuru.dataplane.engine.forward.block_table_store import DeviceBlockTables
from rimuru.dataplane.engine.forward.in_flight import TokenFill
from rimuru.dataplane.engine.forward.paged_attention import PagedAttentionMeta, SequenceSlice
from rimuru.dataplane.engine.forward.paged_states import HybridStepMeta, StateMeta
from rimuru.dataplane.engine.forward.pinned_upload import to_device
from rimuru.dataplane.engine.graphs.cuda_graphs import DecodeGraphs
from rimuru.dataplane.engine.graphs.piecewise_graphs import PiecewiseGraphs
from rimuru.dataplane.engine.sched.request import Request
from rimuru.dataplane.memory.tables import StatePages
from rimuru.dataplane.model import MoETransformer
from rimuru.dataplane.model.hybrid.transformer import HybridTransformer


@dataclass(frozen=True)
class StepBatch:
    input_ids: list[int]  # [T] every scheduled request's new tokens, concatenated
    positions: list[int]  # [T]
    slices: list[SequenceSlice]  # one per scheduled request
    sample_rows: list[int]  # the row of each request's last token, where it samples
    sample_requests: list[Request]  # the requests whose step completes their tokens
    state_pages: list[StatePages]  # a hybrid model's, one per scheduled request; else empty
    # async scheduling: rows whose input id is a PLACEHOLDER, and whose token it stands for
    pending_rows: list[int] = field(default_factory=list)
    pending_requests: list[Request] = field(default_factory=list)

    @classmethod
    def of(cls, scheduled) -> StepBatch:
        """From the scheduler's ScheduledRequests, before their tokens count as computed."""
        ids: list[int] = []
        positions: list[int] = []
        slices, rows, sampled, states = [], [], [], []
        pending_rows, pending = [], []
        for s in scheduled:
            r, n, done = s.request, s.num_new_tokens, s.request.num_computed_tokens
            start = len(ids)
            ids += r.token_ids(done, n)  # a decode step reads one token, copies nothing else
            positions += range(done, done + n)
            slices.append(SequenceSlice(start, n, done, r.block_table))
            if done + n == r.num_tokens:
                rows.append(start + n - 1)
                sampled.append(r)
            if r.state_pages is not None:
                states.append(r.state_pages)
            if r.num_pending:  # its last token is being sampled by the step in flight
                if r.num_pending > 1 or done + n != r.num_tokens:
                    raise RuntimeError(f"request {r.request_id!r} is scheduled past its tokens")
                pending_rows.append(len(ids) - 1)
                pending.append(r)
        return cls(ids, positions, slices, rows, sampled, states, pending_rows, pending)

    def sample_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [T', D] (T' >= T: a graph may pad) -> the rows that sample [R, D], without
        a host synchronisation: indexing a CUDA tensor by a Python list copies the list from
        pageable memory, which waits for the forward first, so the index is staged through
        pinned memory. A decode step samples every row in order: no gather at all."""
        rows = self.sample_rows
        if len(rows) == hidden.shape[0] and (not rows or rows[-1] == len(rows) - 1):
            return hidden  # strictly increasing rows 0..T-1: all of them
        index = to_device(torch.tensor(rows, dtype=torch.long), hidden.device)
        return hidden.index_select(0, index)

    def state_meta(self, device: torch.device) -> StateMeta:
        return StateMeta.build(
            self.state_pages,
            [s.start for s in self.slices],
            [s.num_new_tokens for s in self.slices],
            [s.num_computed_tokens == 0 for s in self.slices],
            device,
        )


def run_forward(
    batch: StepBatch,
    model: MoETransformer | HybridTransformer,
    graphs: DecodeGraphs | None,
    piecewise: PiecewiseGraphs | None,
    tables: DeviceBlockTables,
    fill: TokenFill | None = None,
) -> torch.Tensor:
    """The batch's final hidden states [T, D], by the first path that serves it; `tables`:
    the block-table store the batch's tables are written to and gathered from; `fill`: the
    tokens of the batch's pending rows, on the device (async scheduling)."""
    if graphs is not None and graphs.serves(batch.slices):
        return graphs.run(
            batch.input_ids, batch.positions, batch.slices, tables, batch.state_pages, fill
        )
    meta = PagedAttentionMeta.build(batch.slices, tables)
    if batch.state_pages:  # a hybrid model: its GDN layers' states too
        states = batch.state_meta(model.device)
        model.states.begin_step(states)
        meta = HybridStepMeta(meta, states)
    if piecewise is not None and piecewise.serves(len(batch.input_ids)):
        return piecewise.run(batch.input_ids, batch.positions, meta, fill)
    # staged through pinned memory: torch.tensor(..., device=cuda) would wait for the device
    ids = to_device(torch.tensor([batch.input_ids, batch.positions]), model.device)
    if fill is not None:
        fill.apply(ids[0])
    return model.forward(ids[0], ids[1], meta)
