"""The device block-table store against the tables and slots the engine built on the host
before it (`host_built`, the old code kept here as the reference): exactly equal over steps
that append blocks, finish and preempt requests and reuse their rows; and what a step
copies in does not grow with the context."""

import math
import random

import numpy as np
import pytest
import torch

from rimuru.dataplane.engine.forward.block_table_store import DeviceBlockTables
from rimuru.dataplane.engine.forward.paged_attention import PagedAttentionMeta, SequenceSlice
from rimuru.dataplane.engine.sched.request import SamplingParams
from rimuru.dataplane.memory.geometry import PageType
from rimuru.dataplane.memory.tables import BlockTable

B = 16


def host_built(slices: list[SequenceSlice], num_layers: int, block_size: int = B):
    """[L, S, max_blocks] int32 tables (0 past a sequence's blocks) and [L, T] int64 slots,
    as PagedAttentionMeta.build made them on the host, every step, before the store."""
    max_blocks = max(len(s.table) for s in slices)
    tables = np.zeros((num_layers, len(slices), max_blocks), dtype=np.int32)
    for i, s in enumerate(slices):
        tables[:, i, : len(s.table)] = s.table.array().T
    lengths = [s.num_new_tokens for s in slices]
    seq_of = np.repeat(np.arange(len(slices)), lengths)
    pos = np.concatenate([np.arange(s.num_computed_tokens, s.context_len) for s in slices])
    pages = tables[:, seq_of, pos // block_size].astype(np.int64)
    return tables, np.ascontiguousarray(pages * block_size + pos % block_size)


class _Seq:
    """A request as the scheduler drives its table: tokens computed, blocks to hold them."""

    def __init__(self, num_layers: int, prompt: int):
        self.table, self.computed, self.prompt = BlockTable(num_layers), 0, prompt

    def grow(self, new: int, next_page) -> None:
        while len(self.table) < math.ceil((self.computed + new) / B):
            self.table.append_block([next_page() for _ in range(self.table.num_layers)])


def _steps(num_layers: int, num_rows: int, num_steps: int, seed: int):
    """Random steps of at most num_rows running sequences: prompt chunks, decodes, new
    requests, finishes and preemptions (a preempted request runs again later, recomputed
    from token 0 on new pages). Yields each step's slices."""
    rng = random.Random(seed)
    pages = iter(range(1, 10**9))
    running: list[_Seq] = []
    preempted: list[_Seq] = []
    for _ in range(num_steps):
        for s in list(running):
            roll = rng.random()
            if roll < 0.1:  # finished (or aborted): its pages go back
                s.table.pop_blocks()
                running.remove(s)
            elif roll < 0.18:  # preempted
                s.table.pop_blocks()
                s.computed = 0
                running.remove(s)
                preempted.append(s)
        while len(running) < num_rows and rng.random() < 0.6:
            if preempted and rng.random() < 0.5:
                running.append(preempted.pop(0))
            else:
                running.append(_Seq(num_layers, rng.randint(1, 70)))
        if not running:
            continue
        slices, start = [], 0
        for s in running:
            left = s.prompt - s.computed
            new = rng.randint(1, left) if left > 0 else 1  # a prompt chunk, or a decode
            s.grow(new, lambda: next(pages))
            slices.append(SequenceSlice(start, new, s.computed, s.table))
            start += new
        yield slices
        for sl, s in zip(slices, running, strict=True):
            s.computed += sl.num_new_tokens
            if s.computed >= s.prompt:
                s.prompt = s.computed  # decoding: one token a step from here


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_device_tables_and_slots_equal_the_host_built_ones_step_after_step(seed):
    num_layers, num_rows = 3, 4
    store = DeviceBlockTables(num_layers, num_rows, width=8, block_size=B, device="cpu")
    tables_seen: set[int] = set()
    num_steps = 0
    for slices in _steps(num_layers, num_rows, num_steps=120, seed=seed):
        meta = PagedAttentionMeta.build(slices, store)
        tables, slots = host_built(slices, num_layers)
        assert meta.block_tables.dtype == torch.int32 and meta.block_tables.is_contiguous()
        assert meta.slot_mapping.dtype == torch.int64 and meta.slot_mapping.is_contiguous()
        assert np.array_equal(meta.block_tables.numpy(), tables)
        assert np.array_equal(meta.slot_mapping.numpy(), slots)
        store.check_invariants()
        tables_seen.update(id(s.table) for s in slices)
        num_steps += 1
    # more requests held rows than there are rows: rows were handed back and reused
    assert num_steps > 100 and len(tables_seen) > 3 * num_rows


def test_a_preempted_request_is_written_again_from_its_first_block():
    store = DeviceBlockTables(num_layers=2, num_rows=1, width=4, block_size=B, device="cpu")
    table = BlockTable(2)
    for pages in ([1, 2], [3, 4], [5, 6]):
        table.append_block(pages)
    assert store.assign([table]) == [0]
    store.upload(np.empty(0, np.int32))
    table.pop_blocks()  # preempted: recomputed later on other, fewer pages
    table.append_block([7, 8])
    assert store.assign([table]) == [0]
    store.upload(np.empty(0, np.int32))
    assert store.num_uploaded_blocks == 1
    # the row's old blocks 1 and 2 are gone, not left behind the new block 0
    assert store.store[:, 0].tolist() == [[7, 0, 0, 0], [8, 0, 0, 0]]
    store.check_invariants()


def test_rows_run_out_only_when_more_requests_than_rows_hold_pages():
    store = DeviceBlockTables(num_layers=1, num_rows=2, width=4, block_size=B, device="cpu")
    a, b, c = BlockTable(1), BlockTable(1), BlockTable(1)
    for i, t in enumerate((a, b, c)):
        t.append_block([i])
    assert store.assign([a, b]) == [0, 1]
    store.upload(np.empty(0, np.int32))
    with pytest.raises(RuntimeError, match="more than 2 requests hold KV pages"):
        store.assign([c])
    a.pop_blocks()  # a finished: its row goes to c
    assert store.assign([c]) == [0]
    store.upload(np.empty(0, np.int32))
    store.check_invariants()


def test_a_request_longer_than_the_store_is_refused():
    store = DeviceBlockTables(num_layers=1, num_rows=1, width=2, block_size=B, device="cpu")
    table = BlockTable(1)
    for page in range(3):
        table.append_block([page])
    with pytest.raises(ValueError, match="3 blocks, more than the 2"):
        store.assign([table])


def _decode_uploads(store: DeviceBlockTables, context: int, num_seqs: int, num_steps: int):
    """What each of num_steps decode steps of num_seqs sequences at `context` tokens copies in."""
    seqs = [_Seq(num_layers=store.num_layers, prompt=context) for _ in range(num_seqs)]
    pages = iter(range(1, 10**9))
    slices = []
    for i, s in enumerate(seqs):  # the prompts, in one step
        s.grow(context, lambda: next(pages))
        slices.append(SequenceSlice(i * context, context, 0, s.table))
    PagedAttentionMeta.build(slices, store)
    for s in seqs:
        s.computed = context
    uploads = []
    for _ in range(num_steps):
        slices = []
        for i, s in enumerate(seqs):
            s.grow(1, lambda: next(pages))
            slices.append(SequenceSlice(i, 1, s.computed, s.table))
        PagedAttentionMeta.build(slices, store)
        uploads.append((store.num_uploaded_blocks, store.num_uploaded_values))
        for s in seqs:
            s.computed += 1
    return uploads


def test_what_a_decode_step_copies_in_does_not_grow_with_the_context():
    def uploads(context: int):
        store = DeviceBlockTables(num_layers=48, num_rows=8, width=256, block_size=B, device="cpu")
        return _decode_uploads(store, context, num_seqs=8, num_steps=40)

    short, long = uploads(20), uploads(20 + 100 * B)  # same offset in their last block
    assert short == long
    # a new block for every sequence every 16 steps; else only the step's [S] and [T] vectors
    assert {blocks for blocks, _ in short} == {0, 8}
    assert max(values for _, values in short) == 8 * (2 + 48) + 3 * 8 + 1 + 2 * 8


def test_static_decode_buffers_are_filled_from_the_store(make_engine):
    """The decode graphs' static tables and slots, filled by device ops from the store, hold
    what the host used to write: each sequence's blocks, the pad page in column 0 of a
    padding row, slot -1 for padding."""
    engine = make_engine("resident")
    graphs = engine.make_cuda_graphs(capture=False)
    graphs.sizes = (4,)
    layers = engine.model_config.num_kv_layers
    owner = "test"

    def page() -> int:
        return engine.allocator.allocate(PageType.KV, 1, owner)[0]

    seqs = [_Seq(layers, prompt=p) for p in (5, 17, 40)]
    for step in range(20):
        if step == 8:  # the second sequence finishes; its row goes to a new one
            seqs[1].table.pop_blocks()
            seqs[1] = _Seq(layers, prompt=3)
        slices = []
        for i, s in enumerate(seqs):
            s.computed = max(s.computed, s.prompt - 1)
            s.grow(1, page)
            slices.append(SequenceSlice(i, 1, s.computed, s.table))
        graphs.run(
            [1] * len(slices), [s.num_computed_tokens for s in slices], slices, engine.block_tables
        )
        n = len(slices)
        tables, slots = host_built(slices, layers)
        for i, s in enumerate(slices):
            blocks = len(s.table)
            assert np.array_equal(graphs.tables[:, i, :blocks].numpy(), tables[:, i, :blocks])
        assert graphs.tables[:, n:4, 0].tolist() == [[p] * (4 - n) for p in graphs.pad_pages]
        assert np.array_equal(graphs.slots[:, :n].numpy(), slots)
        assert (graphs.slots[:, n:4] == -1).all()
        assert graphs.seq_lens[:4].tolist() == [s.context_len for s in slices] + [1] * (4 - n)
        assert graphs.rows[:4].tolist() == [1] * n + [0] * (4 - n)
        for s in seqs:
            s.computed += 1
        engine.block_tables.check_invariants()


def test_an_engine_decode_step_copies_in_the_same_whatever_the_context(make_engine):
    """Through the engine: every decode step of a prompt 50 or 50 + 20 * 16 tokens long
    copies the same blocks and values into the store (the host once sent [L, S, W] tables)."""
    params = SamplingParams(max_tokens=40, ignore_eos=True)

    def decode_uploads(prompt_len: int):
        engine = make_engine("resident")
        engine.add_request([7 * i % 1000 for i in range(prompt_len)], params)
        uploads = []
        while engine.has_unfinished_requests():
            engine.step()
            if engine.stats[-1].num_scheduled_tokens == 1:  # a decode step
                store = engine.block_tables
                uploads.append((store.num_uploaded_blocks, store.num_uploaded_values))
        assert engine.scheduler.num_preemptions == 0 and engine.num_leaked_pages() == 0
        return uploads

    short = decode_uploads(50)
    layers = 4  # the tiny preset's
    # 39 decodes at positions 50..88: a new block at 64 and 80, else only the step's
    # 3 * S + 1 + 2 * T values
    assert len(short) == 39 and short.count((1, 2 + layers + 6)) == 2
    assert short.count((0, 6)) == 37
    assert decode_uploads(50 + 20 * B) == short


def test_an_engine_with_two_rows_serves_requests_that_finish_and_are_preempted(
    prompts, make_engine
):
    """max_num_seqs=2: two rows for six requests, in a pool so small that requests are
    preempted; each request takes a row again after it finished or was preempted, and the
    rows match the requests' tables after every step."""
    engine = make_engine("resident", pool_mib=24.3, max_num_seqs=2)
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    ids = [engine.add_request(p, params) for p in prompts[:6]]
    while engine.has_unfinished_requests():
        engine.step()
        engine.check_invariants()  # the store's rows against the requests' tables
    assert engine.block_tables.store.shape[1] == 2
    assert engine.scheduler.num_preemptions > 0
    assert all(len(engine.requests[i].output_token_ids) == 16 for i in ids)
    assert engine.num_leaked_pages() == 0
