"""Cached-free KV pages in the allocator (prefix caching): capacity taken last, LRU, and
given up so that an expert page merges back."""

import pytest

from rimuru.dataplane.memory.allocator import CACHED, PageAllocator
from rimuru.dataplane.memory.geometry import PageType
from rimuru.dataplane.memory.reclaim import DeferredReclaim, Pending

KV, EXPERT, HUGE = PageType.KV, PageType.EXPERT, PageType.HUGE
# geometry fixture: 4 KV pages per expert page, a huge page is one expert page


def test_cached_pages_count_as_free_and_are_taken_last_oldest_first(geometry):
    a = PageAllocator(geometry, num_huge_pages=4)  # 16 KV pages
    dropped = []
    a.on_drop = dropped.append
    assert a.allocate(KV, 16, "r") == list(range(16))
    a.cache(KV, [0, 1], "r", key="a")
    a.cache(KV, [4, 5], "r", key="b")
    a.cache(KV, [2, 3], "r", key="c")
    a.free(KV, [8], "r")
    assert a.num_free(KV) == 7 and a.num_cached() == 6 and a.num_owned(KV) == 9
    a.check_invariants()
    assert a.allocate(KV, 1, "s") == [8]  # truly free first: nothing dropped
    assert dropped == []
    got = a.allocate(KV, 3, "s")  # the oldest group, then the next
    assert dropped == ["a", "b"] and sorted(got) == [0, 1, 4]
    assert a.num_cached() == 2 and a.num_free(KV) == 3  # page 5 free, group c cached
    assert a.uncache("c", "t") == (2, 3)  # a hit takes the group back whole
    assert a.owner_of(KV, 2) == "t" and a.num_free(KV) == 1
    a.check_invariants()
    assert a.allocate(KV, 2, "s") is None  # exhaustion changes nothing
    a.check_invariants()


def test_lru_order_is_the_order_groups_were_cached(geometry):
    a = PageAllocator(geometry, num_huge_pages=4)
    dropped = []
    a.on_drop = dropped.append
    a.allocate(KV, 16, "r")
    for key, page in (("x", 7), ("y", 3), ("z", 11)):
        a.cache(KV, [page], "r", key=key)
    a.uncache("x", "h")  # a hit: x leaves the cache; cached again, it is the newest
    a.cache(KV, [7], "h", key="x")
    a.allocate(KV, 1, "s")
    a.allocate(KV, 1, "s")
    assert dropped == ["y", "z"] and a.is_cached("x") and not a.is_cached("y")


def test_cached_pages_dropped_so_an_expert_page_merges_back(geometry):
    a = PageAllocator(geometry, num_huge_pages=4)
    dropped = []
    a.on_drop = dropped.append
    assert a.allocate(EXPERT, 2, ("expert", 0, 0)) == [0, 1]
    assert a.allocate(KV, 8, "r") == list(range(8, 16))  # expert pages 2 and 3
    a.cache(KV, [8, 12], "r", key="old")  # one page in each
    a.cache(KV, [9, 10], "r", key="new")
    a.free(KV, [11], "r")  # expert page 2: free 11, cached 8, 9, 10 -> mergeable
    assert a.num_free(EXPERT) == 1 and a.num_free(KV) == 5
    a.check_invariants()
    assert a.allocate(EXPERT, 2, ("expert", 0, 1)) is None  # page 3 holds live KV pages
    # the expert page 2 merges back: every group in it goes, the older first
    assert a.allocate(EXPERT, 1, ("expert", 0, 1)) == [2]
    assert dropped == ["old", "new"]
    assert a.owner_of(KV, 12) is None and a.num_cached() == 0  # 12 went with its group
    assert a.num_free(KV) == 1  # page 12
    a.check_invariants()


def test_a_kv_shortfall_counts_cached_pages(geometry):
    a = PageAllocator(geometry, num_huge_pages=4)
    a.allocate(KV, 16, "r")
    a.cache(KV, [0, 1, 2], "r", key="k")
    assert a.expert_pages_short({KV: 3}) == 0
    assert a.expert_pages_short({KV: 4}) == 1


def test_misuse_raises_and_changes_nothing(geometry):
    a = PageAllocator(geometry, num_huge_pages=1)
    a.allocate(KV, 2, "r")
    a.cache(KV, [0], "r", key="k")
    with pytest.raises(ValueError, match="already cached"):
        a.cache(KV, [1], "r", key="k")
    with pytest.raises(ValueError, match=r"not allocated|belongs"):
        a.cache(KV, [0], "r", key="j")  # cached pages are CACHED's, not r's
    with pytest.raises(ValueError, match="nothing is cached"):
        a.uncache("j", "r")
    with pytest.raises(ValueError, match="cannot transfer"):
        a.transfer(KV, [1], "r", CACHED)
    a.check_invariants()


def test_released_pages_are_cached_only_after_their_step(geometry):
    a = PageAllocator(geometry, num_huge_pages=4)
    reclaim = DeferredReclaim(a)
    a.allocate(KV, 2, "r")
    reclaim.release(KV, [0, 1], "r", step=3, cache_key="k")
    assert a.owner_of(KV, 0) == Pending(3) and not a.is_cached("k") and reclaim.is_pending("k")
    assert a.num_free(KV) == 14  # not yet capacity: the step may still read them
    reclaim.complete(3)
    assert a.is_cached("k") and a.num_free(KV) == 16 and not reclaim.is_pending("k")
    a.check_invariants()
