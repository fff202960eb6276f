"""Random operation sequences over all four page types: no leaked, lost, double-owned or
overlapping page, ever; freeing everything merges back to whole huge pages.

Three geometries: a tiny one whose pages all divide their parents, a tiny one with padded
KV and conv slots and a huge page that is the lcm of unequal expert and SSM pages, and
Qwen3.5-35B-A3B's real one (2 MiB expert = SSM = huge page, 32 KiB KV, 64 KiB conv slot).
`check_invariants` checks byte ranges from page ids (page p of slot S covers
[p*S, (p+1)*S)), so overlap is caught whatever the bookkeeping believes.
"""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from rimuru.dataplane.memory.allocator import PageAllocator
from rimuru.dataplane.memory.geometry import MemoryShape, PageGeometry, PageType
from rimuru.dataplane.memory.reclaim import DeferredReclaim

KV, EXPERT, SSM, CONV, HUGE = (
    PageType.KV,
    PageType.EXPERT,
    PageType.SSM,
    PageType.CONV,
    PageType.HUGE,
)
GEOMETRIES = {
    # expert 1024, KV 256, conv 128, SSM 768: huge = lcm(1024, 768) = 3072
    "tiny": PageGeometry.from_shape(
        MemoryShape(2, 4, 16, 16, 1, 2, 4, ssm_state_bytes=768, conv_state_bytes=128)
    ),
    # expert 1536, KV 640 in 768, conv 160 in 192, SSM 1024: huge = 3072
    "tiny-padded": PageGeometry.from_shape(
        MemoryShape(2, 4, 16, 24, 5, 1, 4, ssm_state_bytes=1024, conv_state_bytes=160)
    ),
    "qwen3.5-35b-a3b": PageGeometry.from_shape(
        MemoryShape(40, 256, 2048, 512, 2, 256, 2, ssm_state_bytes=2**21, conv_state_bytes=49152)
    ),
}
NUM_GDN_LAYERS = 3  # state pages per hybrid request: one SSM and one conv page per GDN layer


def test_the_padded_geometry_is_what_the_machine_assumes():
    g = GEOMETRIES["tiny-padded"]
    assert {t: g.bytes_of(t) for t in PageType} == {
        HUGE: 3072, EXPERT: 1536, SSM: 1024, KV: 768, CONV: 192,
    }  # fmt: skip
    assert [g.ratio(t) for t in (EXPERT, SSM, KV, CONV)] == [2, 3, 2, 8]
    assert g.content_bytes_of(KV) == 640 and g.content_bytes_of(CONV) == 160


class Model:
    """Reference bookkeeping: which pages each owner believes it holds, per type.

    Owners are ("pages", n) holding pages of one type, or ("request", n) holding what a
    hybrid request holds: SSM and conv pages per GDN layer and KV pages, freed together."""

    def __init__(self, geometry: PageGeometry, num_huge: int, seed: int):
        self.a = PageAllocator(geometry, num_huge)
        self.reclaim = DeferredReclaim(self.a)
        self.held: dict[tuple, dict[PageType, list[int]]] = {}
        self.step = 0
        self.rng = random.Random(seed)
        self.next_owner = 0
        # keys of KV groups handed to the prefix cache (cached-free or pending reclaim);
        # allocation drops cached ones and says so
        self.cached: set[tuple] = set()
        self.a.on_drop = self.cached.remove

    def _owner(self, kind: str) -> tuple:
        self.next_owner += 1
        return (kind, self.next_owner)

    def alloc(self, page_type: PageType, n: int) -> None:
        owner = self._owner("pages")
        could = self.a.can_allocate(page_type, n)
        pages = self.a.allocate(page_type, n, owner)
        assert (pages is not None) == could
        if pages:
            self.held[owner] = {page_type: pages}

    def admit(self, num_kv: int) -> None:
        """A hybrid request: all its state pages and its first KV pages, or none of them."""
        owner = self._owner("request")
        wanted = {SSM: NUM_GDN_LAYERS, CONV: NUM_GDN_LAYERS, KV: num_kv}
        got: dict[PageType, list[int]] = {}
        for page_type, n in wanted.items():
            pages = self.a.allocate(page_type, n, owner)
            if pages is None:  # roll back what was taken: admission is all or nothing
                for t, ids in got.items():
                    self.a.free(t, ids, owner)
                return
            got[page_type] = pages
        self.held[owner] = got

    def grow(self) -> None:  # a running request asks for one more KV page
        requests = sorted(o for o in self.held if o[0] == "request")
        if requests:
            owner = self.rng.choice(requests)
            more = self.a.allocate(KV, 1, owner)
            if more:
                self.held[owner][KV] += more

    def free(self, deferred: bool) -> None:
        if not self.held:
            return
        owner = self.rng.choice(sorted(self.held))
        for page_type, pages in self.held.pop(owner).items():
            if deferred:
                self.reclaim.release(page_type, pages, owner, self.step)
            else:
                self.a.free(page_type, pages, owner)

    def cache(self, deferred: bool) -> None:
        """An owner of KV pages lets them go into the prefix cache, as one group."""
        owners = sorted(o for o, by_type in self.held.items() if list(by_type) == [KV])
        if not owners:
            return
        owner = self.rng.choice(owners)
        pages = self.held.pop(owner)[KV]
        step = self.step if deferred else self.reclaim.last_completed_step
        self.reclaim.release(KV, pages, owner, step, cache_key=owner)
        self.cached.add(owner)

    def hit(self) -> None:
        """A new owner takes a cached group back whole."""
        keys = sorted(k for k in self.cached if self.a.is_cached(k))
        if keys:
            key = self.rng.choice(keys)
            self.cached.remove(key)
            owner = self._owner("hit")
            self.held[owner] = {KV: list(self.a.uncache(key, owner))}

    def complete_step(self) -> None:
        self.reclaim.complete(self.step)
        self.step += 1

    def check(self) -> None:
        self.a.check_invariants()
        for key in self.cached:
            assert self.a.is_cached(key) != self.reclaim.is_pending(key)
        assert sum(map(self.a.is_cached, self.cached)) == len(self.a._cached_groups)
        for owner, by_type in self.held.items():
            for page_type, pages in by_type.items():
                assert all(self.a.owner_of(page_type, p) == owner for p in pages)
        live = {(t, p) for by_type in self.held.values() for t, ps in by_type.items() for p in ps}
        pending = self.reclaim.num_pending()
        owned = sum(self.a.num_owned(t) for t in (EXPERT, SSM, KV, CONV))
        assert owned == len(live) + pending  # every owned page is held or pending, once

    def drain(self) -> None:
        for owner, by_type in list(self.held.items()):
            for page_type, pages in by_type.items():
                self.a.free(page_type, pages, owner)
        self.held.clear()
        self.reclaim.complete(self.step)
        for key in sorted(self.cached):
            self.a.free(KV, self.a.uncache(key, key), key)
        self.cached.clear()
        self.a.check_invariants()
        # nothing leaked: every huge page merged back whole
        assert self.a.num_free(HUGE) == self.a.num_huge_pages
        assert not self.a._splits and not list(self.a.owned_pages())


TYPES = st.sampled_from([KV, KV, EXPERT, SSM, CONV])


def machine_for(geometry: PageGeometry, num_huge: int) -> type[RuleBasedStateMachine]:
    class AllocatorMachine(RuleBasedStateMachine):
        def __init__(self):
            super().__init__()
            self.m = Model(geometry, num_huge, seed=0)

        @rule(page_type=TYPES, n=st.integers(0, 9))
        def alloc(self, page_type, n):
            self.m.alloc(page_type, n)

        @rule(num_kv=st.integers(1, 12))
        def admit(self, num_kv):
            self.m.admit(num_kv)

        @rule()
        def grow(self):
            self.m.grow()

        @rule(deferred=st.booleans())
        def free(self, deferred):
            self.m.free(deferred)

        @rule(deferred=st.booleans())
        def cache(self, deferred):
            self.m.cache(deferred)

        @rule()
        def hit(self):
            self.m.hit()

        @rule()
        def complete_step(self):
            self.m.complete_step()

        @invariant()
        def consistent(self):
            self.m.check()

        def teardown(self):
            self.m.drain()

    test = AllocatorMachine.TestCase
    test.settings = settings(max_examples=40, stateful_step_count=60, deadline=None)
    return test


TestTinyMachine = machine_for(GEOMETRIES["tiny"], num_huge=4)
TestTinyPaddedMachine = machine_for(GEOMETRIES["tiny-padded"], num_huge=4)
TestQwen35Machine = machine_for(GEOMETRIES["qwen3.5-35b-a3b"], num_huge=8)


@pytest.mark.parametrize("name", sorted(GEOMETRIES))
@settings(max_examples=2, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_fifty_thousand_random_operations(name, seed):
    m = Model(GEOMETRIES[name], num_huge=16, seed=seed)
    ops = [
        lambda: m.alloc(KV, m.rng.randint(1, 12)),
        lambda: m.alloc(EXPERT, m.rng.randint(1, 3)),
        lambda: m.alloc(m.rng.choice([SSM, CONV]), m.rng.randint(1, 3)),
        lambda: m.admit(m.rng.randint(1, 8)),
        m.grow,
        m.grow,
        lambda: m.free(deferred=True),
        lambda: m.free(deferred=False),
        lambda: m.cache(deferred=m.rng.random() < 0.5),
        m.hit,
        m.complete_step,
    ]
    for i in range(50_000):
        m.rng.choice(ops)()
        if i % 2_000 == 0:
            m.check()
    m.check()
    m.drain()
