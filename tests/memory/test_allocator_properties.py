"""Random operation sequences: no leaked, lost or double-owned page, ever."""

import random

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from rimuru.dataplane.memory.allocator import PageAllocator
from rimuru.dataplane.memory.geometry import MemoryShape, PageGeometry, PageType
from rimuru.dataplane.memory.reclaim import DeferredReclaim

KV, EXPERT, SSM, CONV = PageType.KV, PageType.EXPERT, PageType.SSM, PageType.CONV
GEOMETRY = PageGeometry.from_shape(
    MemoryShape(2, 4, 16, 16, 1, 2, 4, ssm_state_bytes=768, conv_state_bytes=128)
)


class Model:
    """Reference bookkeeping: which pages each owner believes it holds."""

    def __init__(self, num_huge: int, seed: int):
        self.a = PageAllocator(GEOMETRY, num_huge)
        self.reclaim = DeferredReclaim(self.a)
        self.held: dict[tuple, list[int]] = {}
        self.step = 0
        self.rng = random.Random(seed)
        self.next_owner = 0

    def alloc(self, page_type: PageType, n: int) -> None:
        owner = (page_type.value, self.next_owner)
        self.next_owner += 1
        could = self.a.can_allocate(page_type, n)
        pages = self.a.allocate(page_type, n, owner)
        assert (pages is not None) == could
        if pages:
            self.held[owner] = pages

    def grow(self) -> None:  # a running request asks for one more KV page
        kv_owners = [o for o in self.held if o[0] == "kv"]
        if kv_owners:
            owner = self.rng.choice(kv_owners)
            more = self.a.allocate(KV, 1, owner)
            if more:
                self.held[owner] += more

    def free(self, deferred: bool) -> None:
        if not self.held:
            return
        owner = self.rng.choice(sorted(self.held))
        pages = self.held.pop(owner)
        page_type = PageType(owner[0])
        if deferred:
            self.reclaim.release(page_type, pages, owner, self.step)
        else:
            self.a.free(page_type, pages, owner)

    def complete_step(self) -> None:
        self.reclaim.complete(self.step)
        self.step += 1

    def check(self) -> None:
        self.a.check_invariants()
        owned = {(PageType(o[0]), p): o for o, ps in self.held.items() for p in ps}
        for key, owner in owned.items():
            assert self.a.owner_of(*key) == owner

    def drain(self) -> None:
        for owner, pages in list(self.held.items()):
            self.a.free(PageType(owner[0]), pages, owner)
        self.held.clear()
        self.reclaim.complete(self.step)
        assert self.a.num_free(PageType.HUGE) == self.a.num_huge_pages  # nothing leaked


TYPES = st.sampled_from([KV, KV, KV, EXPERT, SSM, CONV])


class AllocatorMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.m = Model(num_huge=4, seed=0)

    @rule(page_type=TYPES, n=st.integers(0, 9))
    def alloc(self, page_type, n):
        self.m.alloc(page_type, n)

    @rule()
    def grow(self):
        self.m.grow()

    @rule(deferred=st.booleans())
    def free(self, deferred):
        self.m.free(deferred)

    @rule()
    def complete_step(self):
        self.m.complete_step()

    @invariant()
    def consistent(self):
        self.m.check()

    def teardown(self):
        self.m.drain()


TestAllocatorMachine = AllocatorMachine.TestCase
TestAllocatorMachine.settings = settings(max_examples=60, stateful_step_count=60, deadline=None)


@settings(max_examples=3, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_hundred_thousand_random_operations(seed):
    m = Model(num_huge=16, seed=seed)
    ops = [
        lambda: m.alloc(KV, m.rng.randint(1, 12)),
        lambda: m.alloc(EXPERT, 3),
        lambda: m.alloc(m.rng.choice([SSM, CONV]), m.rng.randint(1, 3)),
        m.grow,
        m.grow,
        lambda: m.free(deferred=True),
        lambda: m.free(deferred=False),
        m.complete_step,
    ]
    for i in range(100_000):
        m.rng.choice(ops)()
        if i % 2_000 == 0:
            m.check()
    m.check()
    m.drain()
    m.a.check_invariants()
