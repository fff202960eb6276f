"""Device copy-in (expert_copy="device"): the same tokens as host-driven copies under every
offloading policy, fixed slots that follow each eviction and load, and decode steps that a
CUDA graph could take even with experts offloaded."""

import pytest

from rimuru.dataplane.engine.sched.request import SamplingParams
from rimuru.dataplane.engine.startup.config import EngineConfig
from rimuru.dataplane.memory.geometry import PageType

PARAMS = SamplingParams(max_tokens=16, ignore_eos=True)


@pytest.mark.parametrize("mode", ["fixed", "elastic"])
def test_device_copy_gives_the_host_copy_tokens(prompts, make_engine, mode):
    host = make_engine(mode, expert_copy="host")
    want = host.generate(prompts, PARAMS)
    dev = make_engine(mode, expert_copy="device")
    # outside the pool, one unread slot (its slots are pool pages), not host mode's two
    # buffers of 32 (the pools are equal by make_engine's sizing)
    page = dev.geometry.expert_page_bytes
    assert (dev.plan.loading_buffer_bytes, host.plan.loading_buffer_bytes) == (
        3 * page,
        2 * 3 * 32 * page,
    )
    got = dev.generate(prompts, PARAMS)
    assert got == want
    dev.check_invariants()
    assert dev.num_leaked_pages() == 0
    c = dev.expert_counters
    assert c.buffer_copies > 0  # counted by the copy, read once per step
    expert_bytes = 3 * dev.geometry.expert_page_bytes  # tiny: a matrix fills its page
    assert c.bytes_h2d == (c.buffer_copies + c.loads) * expert_bytes
    if mode == "elastic":
        assert dev.expert_counters.evictions > 0 and dev.expert_counters.loads > 0


def test_slots_are_pool_pages_taken_from_evictions_and_given_back_by_loads(make_engine):
    """A slot exists while some layer offloads that many experts: the eviction that needs
    one more slot gives it its pages; a load that leaves a slot unused frees it."""
    engine = make_engine("resident", expert_copy="device")
    experts, dc, alloc = engine.residency, engine.residency.loading_slots, engine.allocator
    assert dc.slots == [] and (dc.offloaded() == -1).all()  # nothing offloaded, no slot
    pages_of = {e: experts.table.pages(1, e) for e in (5, 2)}
    free = alloc.num_free(PageType.EXPERT)
    for e in (5, 2):
        experts.evict(1, e, last_step=engine.step_id)
    # each eviction needed one more slot: its own pages became the slot, nothing was freed
    assert dc.slots == [pages_of[5], pages_of[2]]
    assert alloc.num_free(PageType.EXPERT) == free
    assert [alloc.owner_of(PageType.EXPERT, p) for p in pages_of[2]] == [("loading slot", 1)] * 3
    # offloaded experts in id order, one slot each; the kernel table names their slot pages
    assert dc.offloaded()[1].tolist()[:3] == [2, 5, -1]
    table = dc.table_on_device()  # the CPU: the host tensor itself
    assert tuple(table[1, 2].tolist()) == pages_of[5]  # slot 0
    assert tuple(table[1, 5].tolist()) == pages_of[2]  # slot 1
    assert dc.slot_rows().tolist()[:6] == [*pages_of[5], *pages_of[2]]
    assert tuple(table[1, 0].tolist()) == experts.table.pages(1, 0)  # resident: its pool pages
    # another layer's first eviction needs no new slot: its pages go back to the pool
    layer0 = experts.table.pages(0, 7)
    experts.evict(0, 7, last_step=engine.step_id)
    assert len(dc.slots) == 2
    assert engine.reclaim.num_pending(PageType.EXPERT) == 3  # free once step 0 completes
    engine.reclaim.complete(engine.step_id)
    assert all(alloc.owner_of(PageType.EXPERT, p) is None for p in layer0)
    engine.check_invariants()
    pages = alloc.allocate(PageType.EXPERT, 3, ("expert", 1, 2))
    experts.place(1, 2, tuple(pages))
    assert dc.slots == [pages_of[5]]  # slot 1 freed: layer 1 offloads one expert now
    assert all(alloc.owner_of(PageType.EXPERT, p) is None for p in pages_of[2])
    assert dc.offloaded()[1].tolist()[:2] == [5, -1]
    assert tuple(table[1, 5].tolist()) == pages_of[5]  # moved to slot 0
    assert tuple(table[1, 2].tolist()) == tuple(pages)
    engine.check_invariants()


def test_too_many_offloaded_for_the_slots_is_refused_and_nothing_leaks(make_engine):
    engine = make_engine("elastic", expert_copy="device", loading_buffer_slots=16)
    experts, layer = engine.residency, 0
    assert len(engine.copy_in.buffers) == 1  # device mode: copy and compute on one stream
    assert engine.plan.loading_buffer_bytes == engine.copy_in.buffer_bytes
    resident = sorted(experts.resident[layer])
    evicted = []
    with pytest.raises(RuntimeError, match="slots"):
        for e in resident:
            experts.evict(layer, e, last_step=engine.step_id)
            evicted.append(e)
    assert experts.num_experts - len(experts.resident[layer]) == 16  # stopped at the slots
    refused = resident[len(evicted)]
    assert refused in experts.resident[layer] and experts.table.pages(layer, refused)
    engine.check_invariants()


def test_decode_steps_stay_graph_safe_with_experts_offloaded(prompts, make_engine):
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    host = make_engine("elastic", expert_copy="host")
    want = host.generate(prompts, params)
    engine = make_engine("elastic", expert_copy="device")
    graphs = engine.make_cuda_graphs(capture=False)
    served_offloaded = []  # observe, per graph-served step, whether experts were offloaded
    run = graphs.run

    def observed(*args):
        served_offloaded.append(not engine.residency.fully_resident())
        return run(*args)

    graphs.run = observed
    got = engine.generate(prompts, params)
    assert got == want
    assert any(served_offloaded), "no step with offloaded experts went through the graph inputs"
    engine.check_invariants()


def test_expert_copy_is_validated():
    with pytest.raises(ValueError, match="expert_copy"):
        EngineConfig(expert_copy="gpu")
    with pytest.raises(ValueError, match="expert_copy='host'"):
        EngineConfig(expert_copy="device", moe_path="gather")
    with pytest.raises(ValueError, match="expert_copy='host'"):
        EngineConfig(moe_path="gather")  # device copy-in is the default


def test_a_start_up_residency_past_the_slots_fails_when_loaded_not_mid_step(make_engine):
    """Rows are derived lazily; load_initial derives them at once, so a residency that
    leaves a layer more experts offloaded than the buffer has slots raises there."""
    engine = make_engine("elastic", expert_copy="device", loading_buffer_slots=16)
    experts = engine.residency
    experts.release_all()
    with pytest.raises(RuntimeError, match="16 slots"):
        experts.load_initial([(layer, 0) for layer in range(experts.num_layers)], 3)
