"""Scheduler unit tests on the real allocator: exact preemption order and shortfall."""

import pytest

from rimuru.dataplane.engine.sched.kv_cache import KVCacheManager
from rimuru.dataplane.engine.sched.request import Request, SamplingParams
from rimuru.dataplane.engine.sched.scheduler import Scheduler
from rimuru.dataplane.memory.allocator import PageAllocator
from rimuru.dataplane.memory.geometry import MemoryShape, PageGeometry
from rimuru.dataplane.memory.reclaim import DeferredReclaim


def make(num_huge: int, max_tokens: int = 512, stream_ordered: bool = False) -> Scheduler:
    g = PageGeometry.from_shape(MemoryShape(1, 4, 16, 16, 1, 2, 4))  # 4 KV pages per huge page
    a = PageAllocator(g, num_huge)
    return Scheduler(
        KVCacheManager(a, DeferredReclaim(a, stream_ordered=stream_ordered), 1, 16),
        max_num_seqs=8,
        max_num_batched_tokens=max_tokens,
    )


def req(i: int, n: int) -> Request:
    return Request(f"r{i}", [1] * n, SamplingParams(max_tokens=100), num_layers=1)


def test_running_first_then_waiting_in_order_within_the_budget():
    s = make(4, max_tokens=40)
    for i in range(3):
        s.add(req(i, 16))
    out = s.schedule(1)
    assert [(x.request.request_id, x.num_new_tokens) for x in out.scheduled] == [
        ("r0", 16),
        ("r1", 16),
        ("r2", 8),
    ]
    assert out.kv_pages_short == 0 and [r.request_id for r in s.running] == ["r0", "r1", "r2"]


def test_newest_running_is_preempted_and_shortfall_counted_once():
    s = make(1)  # 4 KV pages
    for i in range(4):
        s.add(req(i, 16))
    s.schedule(1)
    s.kv.reclaim.complete(1)  # the engine marks step 1 complete after its forward
    for r in s.running:
        r.num_computed_tokens = 16
    s.running[0].prompt_token_ids += [1] * 48  # r0 now needs 3 more pages, 0 are free
    out = s.schedule(2)
    assert out.preempted == ("r3", "r2", "r1")
    assert out.kv_pages_short == 3
    assert [x.request.request_id for x in out.scheduled] == ["r0"]
    assert [r.request_id for r in s.waiting] == [
        "r1",
        "r2",
        "r3",
    ]  # back at the front, oldest first
    assert all(r.num_computed_tokens == 0 for r in s.waiting)


def test_a_request_short_of_pages_alone_is_reported_and_others_are_not():
    """Preempting a request that ran alone frees only its own pages: the engine must know,
    since re-admitting it meets the same pool (RequestLimits.check_progress)."""
    s = make(1)  # 4 KV pages
    for i in range(2):
        s.add(req(i, 16))
    s.schedule(1)
    s.kv.reclaim.complete(1)
    for r in s.running:
        r.num_computed_tokens = 16
    s.running[1].prompt_token_ids += [1] * 48  # r1 needs 3 more pages: r0 holds one of 4
    out = s.schedule(2)
    assert out.preempted == ("r1",) and out.preempted_alone is None  # r0 kept its page
    s.kv.reclaim.complete(2)
    s.running[0].prompt_token_ids += [1] * 64  # r0, alone, needs 4 more: only 3 are free
    out = s.schedule(3)
    assert out.preempted == ("r0",) and out.preempted_alone == "r0"


def test_no_admission_in_a_round_that_preempted():
    s = make(1)
    for i in range(4):
        s.add(req(i, 16))
    s.schedule(1)
    s.kv.reclaim.complete(1)  # the engine marks step 1 complete after its forward
    for r in s.running:
        r.num_computed_tokens = 16
    s.running[0].prompt_token_ids += [1] * 16  # needs one page: preempts r3
    s.add(req(9, 1))
    out = s.schedule(2)
    assert out.preempted == ("r3",)
    assert "r9" not in [x.request.request_id for x in out.scheduled]


def test_admit_limit_caps_admission_and_claims_no_pages_for_who_waits():
    """The copy budget's cap (ElasticBoundary.admit_limit): running requests up to it, asked once
    per round; the ones kept waiting are not reported short of pages."""
    s = make(1)  # 4 KV pages: room for 4 one-page requests
    asked = []
    caps = iter([2, 3])
    s.admit_limit = lambda round: asked.append(round.num_running) or next(caps)
    for i in range(4):
        s.add(req(i, 8))
    out = s.schedule(1)
    assert [x.request.request_id for x in out.scheduled] == ["r0", "r1"]
    assert out.kv_pages_short == 0 and [r.request_id for r in s.waiting] == ["r2", "r3"]
    s.kv.reclaim.complete(1)
    for r in s.running:
        r.num_computed_tokens = 8
    out = s.schedule(2)  # the cap rose to 3: one more, r3 still waits
    assert [x.request.request_id for x in out.scheduled] == ["r0", "r1", "r2"]
    assert out.kv_pages_short == 0 and [r.request_id for r in s.waiting] == ["r3"]
    assert asked == [0, 2]  # once per round, before admitting


def test_a_steps_running_gauge_counts_the_batch_before_it_finishes(make_engine):
    """Four one-token requests run in one step and all finish in it: the step's record says
    4 running (its batch), not the 0 left after it."""
    from rimuru.dataplane.engine.sched.request import SamplingParams

    engine = make_engine("resident")
    for i in range(4):
        engine.add_request([7 + i] * 20, SamplingParams(max_tokens=1, ignore_eos=True), f"r{i}")
    engine.step()
    assert not engine.has_unfinished_requests()
    assert engine.stats[-1].num_running == 4


@pytest.mark.parametrize(
    ("stream_ordered", "preempted", "scheduled"),
    [(True, ("r3",), ["r0", "r1", "r2"]), (False, ("r3", "r2", "r1", "r0"), [])],
)
def test_preempted_pages_while_a_step_is_in_flight(stream_ordered, preempted, scheduled):
    """Async scheduling schedules round 2 while step 1, which read every page, still runs.
    In stream order r3's page serves r0 in the same round; parked until step 1 completes,
    it serves no one, and r0 preempts everyone down to itself."""
    s = make(1, stream_ordered=stream_ordered)  # 4 KV pages
    for i in range(4):
        s.add(req(i, 16))
    s.schedule(1)  # step 1 is launched and not complete: nothing marks it so
    for r in s.running:
        r.num_computed_tokens = 16
    s.running[0].prompt_token_ids += [1] * 16  # r0 needs one more page; none is free
    out = s.schedule(2)
    assert out.preempted == preempted
    assert [x.request.request_id for x in out.scheduled] == scheduled
    assert s.kv.reclaim.num_pending() == (0 if stream_ordered else 4)  # parked for step 1
