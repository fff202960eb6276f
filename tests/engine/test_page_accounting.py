"""The engine's page-ownership checks catch what they claim to: pages a finished request
still owns, expert pages no resident expert accounts for."""

import pytest

from rimuru.dataplane.engine.engine import Engine
from rimuru.dataplane.engine.sched.request import SamplingParams
from rimuru.dataplane.engine.startup.config import EngineConfig
from rimuru.dataplane.memory.geometry import PageType
from rimuru.policy import EXPERT_MATRICES


@pytest.fixture
def served() -> Engine:
    """A tiny resident engine after one request finished: its pages all back."""
    engine = Engine(EngineConfig(memory_budget=400 * 2**20), log_plan=False)
    engine.generate([[5, 6, 7, 8]], SamplingParams(max_tokens=3, ignore_eos=True))
    engine.check_invariants()
    assert engine.num_leaked_pages() == 0
    return engine


def test_a_page_a_finished_request_still_owns_is_a_leak(served):
    (request_id,) = served.requests  # finished
    pages = served.allocator.allocate(PageType.KV, 2, request_id)
    assert pages is not None and served.num_leaked_pages() == 2
    with pytest.raises(AssertionError, match=f"leaked by finished requests: \\['{request_id}'\\]"):
        served.check_invariants()
    served.allocator.free(PageType.KV, pages, request_id)
    served.check_invariants()  # given back: nothing to report


def test_an_expert_page_no_resident_expert_accounts_for_is_reported(served):
    resident = served.residency.num_resident() * EXPERT_MATRICES
    owner = ("expert", 0, 10_000)  # an expert the model does not have
    pages = served.allocator.allocate(PageType.EXPERT, 1, owner)
    assert pages is not None
    with pytest.raises(AssertionError, match=f"{resident + 1} expert pages owned, {resident}"):
        served.check_invariants()


def test_loading_slot_pages_the_residency_does_not_need_are_reported(served):
    slots = served.residency.loading_slots
    assert slots is not None  # device copy-in, the default
    assert len(slots.slots) == slots.slots_needed()
    pages = served.allocator.allocate(PageType.EXPERT, 3, ("loading slot", 99))
    assert pages is not None
    with pytest.raises(AssertionError, match=r"loading slots .* for a residency that needs"):
        served.check_invariants()
