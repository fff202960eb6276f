"""Automatic prefix caching (sched/prefix_cache.py): what a hit saves, and that it never
changes a token nor leaks a page."""

import random

import pytest

from rimuru.dataplane.engine.engine import Engine
from rimuru.dataplane.engine.sched.prefix_cache import block_hashes, chain_seed
from rimuru.dataplane.engine.sched.request import SamplingParams
from rimuru.dataplane.engine.startup.config import EngineConfig

GREEDY = SamplingParams(max_tokens=4, ignore_eos=True)


def small_engine(**overrides) -> Engine:
    config = EngineConfig(activation_reserve=0, max_num_batched_tokens=128, **overrides)
    return Engine(config, log_plan=False)


def scheduled_tokens(engine: Engine, since: int = 0) -> list[int]:
    return [s.num_scheduled_tokens for s in engine.stats][since:]


def test_a_second_identical_prompt_computes_only_its_last_partial_block():
    engine = small_engine()
    prompt = [random.Random(0).randrange(1000) for _ in range(70)]
    first = engine.generate([prompt], GREEDY)
    n = len(scheduled_tokens(engine))
    assert scheduled_tokens(engine) == [70, 1, 1, 1]
    second = engine.generate([prompt], GREEDY)
    assert scheduled_tokens(engine, n) == [70 - 64, 1, 1, 1]  # 4 full blocks were cached
    assert first == second
    assert engine.prefix_cache.num_hit_tokens == 64
    assert engine.prefix_cache.num_queried_tokens == 140
    assert [r.num_cached_tokens for r in engine.requests.values()] == [0, 64]
    rid = engine.add_request(prompt, GREEDY)
    outputs = [o for _ in range(4) for o in engine.step() if o.request_id == rid]
    assert [o.num_cached_tokens for o in outputs] == [64] * 4 and outputs[-1].finished
    engine.check_invariants()
    assert engine.num_leaked_pages() == 0


def test_a_block_aligned_prompt_still_computes_its_last_token():
    engine = small_engine()
    prompt = list(range(100, 164))  # exactly 4 blocks
    engine.generate([prompt], GREEDY)
    n = len(scheduled_tokens(engine))
    engine.generate([prompt], GREEDY)
    assert scheduled_tokens(engine, n)[0] == 16  # 3 blocks hit; the 4th holds the last token


def test_off_computes_every_prompt_whole():
    engine = small_engine(enable_prefix_caching=False)
    prompt = list(range(70))
    engine.generate([prompt, prompt], GREEDY)
    engine.generate([prompt], GREEDY)
    assert engine.prefix_cache is None
    assert sum(scheduled_tokens(engine)) == 3 * 70 + 3 * 3


def test_hash_chains_differ_when_any_earlier_token_differs():
    seed = chain_seed("tiny", 0, "torch.float32")
    a = list(range(48))
    b = [7, *a[1:]]  # the first block differs, the last two are the same tokens
    ha, hb = block_hashes(seed, a, 16), block_hashes(seed, b, 16)
    assert len(ha) == len(hb) == 3 and not set(ha) & set(hb)
    assert block_hashes(seed, [*a, 1, 2], 16) == ha  # a partial block is never named
    assert block_hashes(chain_seed("tiny", 1, "torch.float32"), a, 16)[0] != ha[0]
    engine = small_engine()
    engine.generate([[*a, 1, 2, 3]], GREEDY)
    n = len(scheduled_tokens(engine))
    engine.generate([[*b, 1, 2, 3]], GREEDY)  # same last blocks, different first: no hit
    assert scheduled_tokens(engine, n)[0] == 51
    engine.generate([[*a, 9]], GREEDY)  # the first prompt's chain: all 3 blocks hit
    assert scheduled_tokens(engine, 2 * n)[0] == 1


def shared_prefix_prompts(seed: int, num: int) -> list[list[int]]:
    """Prompts that share system prefixes (two of them) and some whole prompts."""
    rng = random.Random(seed)
    systems = [[rng.randrange(151_000) for _ in range(n)] for n in (40, 70)]
    prompts = []
    for i in range(num):
        tail = [rng.randrange(151_000) for _ in range(rng.randint(5, 40))]
        prompts.append(systems[i % 2] + tail)
    prompts += prompts[:3]
    return prompts


PARAMS = [
    SamplingParams(max_tokens=20, ignore_eos=True),
    SamplingParams(max_tokens=20, temperature=1.0, top_p=0.9, seed=5, ignore_eos=True),
]


@pytest.mark.parametrize("params", PARAMS, ids=["greedy", "seeded-sampling"])
@pytest.mark.parametrize("mode", ["resident", "fixed", "elastic"])
def test_same_tokens_with_caching_on_and_off_when_memory_is_tight(mode, params, make_engine):
    prompts = shared_prefix_prompts(3, 12)
    outputs = {}
    for on in (False, True):
        engine = make_engine(mode, 25, enable_prefix_caching=on)
        outputs[on] = engine.generate(prompts, params)
        engine.check_invariants()
        assert engine.num_leaked_pages() == 0
        if mode == "resident":
            assert engine.scheduler.num_preemptions > 0  # the budget really was tight
        if mode == "elastic":
            assert engine.expert_counters.evictions > 0
    assert outputs[True] == outputs[False]
    assert engine.prefix_cache.num_hit_tokens > 0


@pytest.mark.parametrize("mode", ["resident", "elastic"])
def test_random_requests_with_aborts_and_preemptions_leave_no_page_behind(mode, make_engine):
    # (elastic preempts as vLLM does, and moves the boundary between rounds)
    engine = make_engine(mode, 25, evict_to_admit=False)
    rng = random.Random(11)
    systems = [[rng.randrange(151_000) for _ in range(rng.randint(16, 80))] for _ in range(3)]
    live: list[str] = []
    for step in range(160):
        if step < 120 and rng.random() < 0.5:
            prompt = rng.choice(systems) + [
                rng.randrange(151_000) for _ in range(rng.randint(0, 40))
            ]
            params = SamplingParams(max_tokens=rng.randint(1, 24), ignore_eos=True)
            live.append(engine.add_request(prompt, params))
        if live and rng.random() < 0.15:
            engine.abort(live.pop(rng.randrange(len(live))))
        engine.step()
        engine.check_invariants()
    while engine.has_unfinished_requests():
        engine.step()
    engine.check_invariants()
    assert engine.num_leaked_pages() == 0
    assert engine.scheduler.num_preemptions > 0 and engine.prefix_cache.num_hit_tokens > 0
    assert engine.allocator.num_cached() > 0  # finished requests' blocks stay cached


def test_idle_elastic_drops_cached_pages_to_load_experts_back(make_engine):
    engine = make_engine("elastic", 25)
    resident_at_start = engine.residency.num_resident()
    engine.generate(shared_prefix_prompts(5, 12), SamplingParams(max_tokens=20, ignore_eos=True))
    assert engine.residency.num_resident() < resident_at_start  # experts were evicted
    cached = engine.allocator.num_cached()
    assert cached > 0
    for _ in range(200):  # idle rounds: the adjuster grows experts back
        engine.step()
        if engine.residency.num_resident() == resident_at_start:
            break
    assert engine.residency.num_resident() == resident_at_start
    assert engine.allocator.num_cached() < cached  # only by dropping cached pages
    engine.check_invariants()


@pytest.mark.parametrize("mode", ["resident", "elastic"])
def test_async_scheduling_with_caching_gives_the_tokens_of_sync_without(mode, make_engine):
    """Pages released in stream order are cached at once; a hit's forward is queued after
    the one that wrote the blocks."""
    prompts = shared_prefix_prompts(4, 12)
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    want = make_engine(mode, 25, enable_prefix_caching=False).generate(prompts, params)
    engine = make_engine(mode, 25, async_scheduling=True, expert_copy="device")
    assert engine.generate(prompts, params) == want
    assert engine.prefix_cache.num_hit_tokens > 0
    engine.check_invariants()
    assert engine.num_leaked_pages() == 0


@pytest.mark.parametrize(
    "argv, want",
    [([], None), (["--enable-prefix-caching"], True), (["--no-enable-prefix-caching"], False),
     (["--enable-prefix-caching", "off"], False)],
)  # fmt: skip
def test_flags_take_vllms_spellings(argv, want):
    import argparse

    from rimuru.dataplane.engine.flags import add_engine_arguments, engine_config_from_args

    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    assert engine_config_from_args(parser.parse_args(argv)).enable_prefix_caching is want


def test_hybrid_models_run_without_it_and_say_so(caplog):
    with caplog.at_level("INFO", logger="rimuru.engine"):
        engine = small_engine(model="tiny-hybrid")
    assert engine.prefix_cache is None and engine.kv.prefix_cache is None
    assert "prefix caching is off" in caplog.text
    assert small_engine().prefix_cache is not None  # attention-only: on by default


def test_a_finished_chain_is_reclaimed_from_its_end():
    """LRU order: a request's blocks go cached tail first, so allocation drops the last
    block of a chain before its first, and the rest still hits."""
    from rimuru.dataplane.engine.sched.kv_cache import KVCacheManager
    from rimuru.dataplane.engine.sched.prefix_cache import PrefixCache
    from rimuru.dataplane.engine.sched.request import Request
    from rimuru.dataplane.memory.allocator import PageAllocator
    from rimuru.dataplane.memory.geometry import MemoryShape, PageGeometry, PageType
    from rimuru.dataplane.memory.reclaim import DeferredReclaim

    shape = MemoryShape(num_layers=1, num_experts=4, hidden_size=16, moe_intermediate_size=16,
                        num_kv_heads=1, head_dim=2, dtype_bytes=4)  # fmt: skip
    allocator = PageAllocator(PageGeometry.from_shape(shape), num_huge_pages=3)  # 12 KV pages
    reclaim = DeferredReclaim(allocator)
    cache = PrefixCache(allocator, reclaim, 16)
    kv = KVCacheManager(allocator, reclaim, 1, 16, prefix_cache=cache)
    prompt = list(range(65))
    seed = chain_seed("test")

    def request(rid: str) -> Request:
        r = Request(rid, prompt, GREEDY, 1)
        r.block_hashes = block_hashes(seed, prompt, 16)
        return r

    first = request("a")
    assert kv.allocate_slots(first, 65, kv.cached_prefix(first))
    first.num_computed_tokens = 65
    kv.cache_blocks(first)
    assert first.num_shared_blocks == 4
    kv.free(first, last_step=-1)
    assert allocator.num_cached() == 4 and allocator.num_free(PageType.KV) == 12
    assert allocator.allocate(PageType.KV, 8, "filler") is not None  # truly free pages first
    assert len(cache.index) == 4
    assert allocator.allocate(PageType.KV, 1, "filler") is not None
    assert set(cache.index) == set(first.block_hashes[:3])  # the chain's last block went
    second = request("b")
    assert kv.cached_prefix(second).num_tokens == 48
