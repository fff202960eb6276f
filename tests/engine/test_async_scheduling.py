"""Async scheduling (EngineConfig.async_scheduling): round n+1 is scheduled and launched before
round n is read back, and gives the tokens of synchronous scheduling."""

from dataclasses import replace

import pytest

from rimuru.dataplane.engine.engine import Engine
from rimuru.dataplane.engine.sched.request import PLACEHOLDER, SamplingParams
from rimuru.dataplane.engine.startup.config import EngineConfig
from rimuru.dataplane.memory.geometry import PageType
from rimuru.policy import Tunables

from .conftest import tight_engine

RESIDENT = Tunables(mode="resident")


def small_engine(async_scheduling: bool, **overrides) -> Engine:
    config = EngineConfig(activation_reserve=0, max_num_batched_tokens=128, tunables=RESIDENT)
    return Engine(replace(config, async_scheduling=async_scheduling, **overrides), log_plan=False)


GREEDY = SamplingParams(max_tokens=20, ignore_eos=True)
SEEDED = SamplingParams(max_tokens=20, temperature=1.0, top_p=0.9, seed=5, ignore_eos=True)


# Seeded sampling under elastic alone: the sampler is the same under every policy, and
# elastic's rounds (evictions inside them) are the ones async scheduling changes most.
@pytest.mark.parametrize(
    ("policy", "params"),
    [("resident", GREEDY), ("fixed", GREEDY), ("elastic", GREEDY), ("elastic", SEEDED)],
    ids=["resident", "fixed", "elastic", "elastic-seeded"],
)
def test_same_tokens_as_synchronous_scheduling_in_a_tight_pool(prompts, params, policy):
    """Prompts cut into chunks (128-token steps), a pool so tight that resident preempts,
    fixed copies experts in every step and elastic evicts inside rounds (its pages reused in
    stream order): every request's tokens are synchronous scheduling's, no page leaks."""
    engines = {mode: tight_engine(policy, async_scheduling=mode) for mode in (False, True)}
    outputs = {mode: e.generate(prompts, params) for mode, e in engines.items()}
    assert outputs[True] == outputs[False]
    for engine in engines.values():
        engine.check_invariants()
        assert engine.num_leaked_pages() == 0
        counters = engine.expert_counters
        busy = {
            "resident": engine.scheduler.num_preemptions,
            "fixed": counters.buffer_copies,
            "elastic": counters.evictions,
        }
        assert busy[policy] > 0  # the pool really was tight
    assert all(len(out) == 20 for out in outputs[True])


def test_a_stop_token_read_one_step_late_ends_the_request_where_synchronous_does(prompts):
    """The request that meets its stop token was already scheduled again: that step's token
    is dropped, not delivered, and its pages come back."""
    sync = small_engine(False)
    plain = sync.generate(prompts[:4], SamplingParams(max_tokens=16, ignore_eos=True))
    stop = plain[0][5]  # request 0 stops at its 6th token (or earlier, if it repeats)
    params = [
        SamplingParams(max_tokens=16, ignore_eos=True, stop_token_ids=(stop,)),
        SamplingParams(max_tokens=1, ignore_eos=True),  # finishes on its prompt step
        SamplingParams(max_tokens=3, ignore_eos=True),
        SamplingParams(max_tokens=16, ignore_eos=True),
    ]
    want = small_engine(False).generate(prompts[:4], params)
    engine = small_engine(True)
    got = engine.generate(prompts[:4], params)
    assert got == want
    assert got[0][-1] == stop and len(got[0]) <= 6 and len(got[1]) == 1 and len(got[2]) == 3
    assert all(PLACEHOLDER not in out for out in got)
    assert engine.num_leaked_pages() == 0 and engine.allocator.num_owned(PageType.KV) == 0


def test_tokens_arrive_one_call_late_and_the_last_token_is_not_scheduled_past():
    engine = small_engine(True)
    rid = engine.add_request(list(range(5, 25)), SamplingParams(max_tokens=2, ignore_eos=True))
    request = engine.requests[rid]
    assert engine.step() == []  # the prompt step is launched, not read back
    assert request.output_token_ids == [PLACEHOLDER] and request.num_output_tokens == 0
    first = engine.step()  # launches the decode of its first token, reads the prompt step
    assert [o.request_id for o in first] == [rid] and not first[0].finished
    assert request.num_pending == 1 and request.output_token_ids[0] == first[0].new_token_ids[0]
    assert engine.stats[1].num_scheduled_tokens == 1
    # its 2nd (last) token is being sampled: the round schedules nothing for it
    last = engine.step()
    assert engine.stats[2].num_scheduled_tokens == 0
    assert last[0].finished and last[0].finish_reason == "length"
    assert not engine.has_unfinished_requests()
    assert request.output_token_ids == [first[0].new_token_ids[0], last[0].new_token_ids[0]]
    assert engine.num_leaked_pages() == 0


def test_aborting_a_request_while_its_step_is_in_flight(prompts):
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    want = small_engine(False).generate(prompts[:3], params)
    engine = small_engine(True)
    ids = [engine.add_request(p, params) for p in prompts[:3]]
    for _ in range(4):
        engine.step()
    victim = engine.requests[ids[1]]
    assert victim.num_pending == 1  # a token of the step in flight is pending for it
    assert engine.abort(ids[1])
    assert victim.num_pending == 0 and PLACEHOLDER not in victim.output_token_ids
    while engine.has_unfinished_requests():
        outputs = engine.step()
        assert ids[1] not in [o.request_id for o in outputs]
    got = [engine.requests[i].output_token_ids for i in ids]
    assert got[0] == want[0] and got[2] == want[2]
    assert victim.output_token_ids == want[1][: len(victim.output_token_ids)]
    engine.check_invariants()
    assert engine.num_leaked_pages() == 0


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (dict(tunables=Tunables(mode="elastic"), expert_copy="host"), "--expert-copy device"),
        (dict(tensor_parallel_size=2), "--tensor-parallel-size 1"),
    ],
)
def test_refused_where_the_host_must_wait_mid_step(overrides, says):
    with pytest.raises(ValueError, match=says):
        EngineConfig(async_scheduling=True, **{"tunables": RESIDENT, **overrides})


@pytest.mark.parametrize(
    ("overrides", "schedules_async"),
    [
        (dict(), False),  # the CPU: the host is the device, nothing to overlap
        (dict(device="cuda"), True),
        (dict(device="cuda:1", tunables=Tunables(mode="elastic")), True),  # device copy-in
        (dict(device="cuda", tunables=Tunables(mode="elastic"), expert_copy="host"), False),
        (dict(device="cuda", tunables=RESIDENT, expert_copy="host"), True),  # nothing copied
        (dict(device="cuda", tensor_parallel_size=2), False),
        (dict(device="cuda", async_scheduling=False), False),
        (dict(async_scheduling=True), True),  # asked for on the CPU (the tests' path)
    ],
)
def test_by_default_on_wherever_it_can_overlap_host_and_device(overrides, schedules_async):
    assert EngineConfig(**overrides).schedules_async is schedules_async
