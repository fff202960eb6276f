import pytest

from rimuru.dataplane.memory.allocator import PageAllocator
from rimuru.dataplane.memory.geometry import MemoryShape, PageGeometry, PageType
from rimuru.dataplane.memory.reclaim import DeferredReclaim

KV, EXPERT, HUGE = PageType.KV, PageType.EXPERT, PageType.HUGE


def snapshot(a: PageAllocator):
    return (
        {t: a.num_free(t) for t in a.geometry.page_bytes},
        sorted((t.value, p, repr(o)) for t, p, o in a.owned_pages()),
        {k: (s.child_type, sorted(s.free_children)) for k, s in a._splits.items()},
    )


def test_exact_ids_split_and_merge(geometry):
    a = PageAllocator(geometry, num_huge_pages=3)
    assert a.num_free(KV) == 12
    assert a.allocate(KV, 2, "r1") == [0, 1]  # huge 0 -> expert 0 -> KV 0..3
    assert a.allocate(KV, 1, "r2") == [2]
    assert a.allocate(EXPERT, 1, ("e", 0, 0)) == [1]  # a fresh huge page, not a KV parent
    assert a.allocate(KV, 3, "r3") == [3, 8, 9]  # fills expert 0, then splits expert 2
    assert a.num_free(HUGE) == 0 and a.num_free(KV) == 2
    a.check_invariants()
    a.free(KV, [0, 1], "r1")
    a.free(KV, [2], "r2")
    assert a.num_free(HUGE) == 0  # KV 3 still holds expert 0
    a.free(KV, [3, 8, 9], "r3")
    assert a.num_free(HUGE) == 2  # expert pages 0 and 2 merged back into huge pages
    assert a.stats.merges == 4 and a.stats.splits == 5
    a.free(EXPERT, [1], ("e", 0, 0))
    assert a.num_free(HUGE) == 3
    a.check_invariants()


def test_same_request_affinity(geometry):
    a = PageAllocator(geometry, num_huge_pages=2)
    assert a.allocate(KV, 4, "r1") == [0, 1, 2, 3]  # fills expert page 0
    assert a.allocate(KV, 2, "r2") == [4, 5]  # expert page 1
    a.free(KV, [1], "r1")
    # r2 holds pages under expert page 1: it stays there rather than take the lower hole
    assert a.allocate(KV, 1, "r2") == [6]
    # a newcomer takes the lowest free page
    assert a.allocate(KV, 1, "r3") == [1]
    a.check_invariants()


def test_huge_page_never_cut_directly_into_kv():
    shape = MemoryShape(2, 4, 16, 16, 1, 2, 4, ssm_state_bytes=768)
    g = PageGeometry.from_shape(shape)  # huge = 3072 B = 3 expert pages = 12 KV pages
    a = PageAllocator(g, num_huge_pages=2)
    assert a.allocate(KV, 1, "r") == [0]
    assert a._splits[(HUGE, 0)].child_type is EXPERT  # huge -> expert -> KV
    assert a._splits[(EXPERT, 0)].child_type is KV
    assert a.allocate(PageType.SSM, 1, "s") == [4]  # huge 1 split into SSM pages 4..7
    assert a.allocate(EXPERT, 2, "e") == [1, 2]  # the rest of huge 0
    assert a.allocate(EXPERT, 1, "e2") is None  # huge 1 is SSM now
    a.check_invariants()


def test_exhaustion_returns_none_and_changes_nothing(geometry):
    a = PageAllocator(geometry, num_huge_pages=1)
    before = snapshot(a)
    assert a.allocate(KV, 5, "r") is None
    assert snapshot(a) == before
    assert a.allocate(KV, 4, "r") == [0, 1, 2, 3]
    assert a.allocate(EXPERT, 1, "e") is None


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda a: a.free(KV, [0], "r1"), "double free"),
        (lambda a: a.free(KV, [1], "other"), "belongs to 'r1', not 'other'"),
        (lambda a: a.free(KV, [1, 1], "r1"), "appears twice"),
        (lambda a: a.free(KV, [1, 7], "r1"), "page 7 is not allocated"),
        (lambda a: a.allocate(PageType.SSM, 1, "r1"), "unknown page type"),
        (lambda a: a.allocate("kv", 1, "r1"), "unknown page type"),
        (lambda a: a.allocate(HUGE, 1, "r1"), "never handed out whole"),
        (lambda a: a.allocate(KV, -1, "r1"), "negative"),
        (lambda a: a.transfer(KV, [1], "nobody", "x"), "belongs to 'r1'"),
    ],
)
def test_misuse_raises_and_leaves_state_unchanged(geometry, call, message):
    a = PageAllocator(geometry, num_huge_pages=2)
    a.allocate(KV, 2, "r1")
    a.free(KV, [0], "r1")
    before = snapshot(a)
    with pytest.raises(ValueError, match=message):
        call(a)
    assert snapshot(a) == before
    a.check_invariants()


def test_deferred_reclaim_frees_after_step_completes(geometry):
    a = PageAllocator(geometry, num_huge_pages=2)
    reclaim = DeferredReclaim(a)
    pages = a.allocate(KV, 4, "r1")
    expert = a.allocate(EXPERT, 1, ("e", 0, 3))
    reclaim.release(KV, pages, "r1", step=5)
    reclaim.release(EXPERT, expert, ("e", 0, 3), step=6)
    assert a.num_free(KV) == 0 and reclaim.num_pending() == 5
    assert reclaim.complete(4) == 0
    assert a.num_free(HUGE) == 0
    assert reclaim.complete(5) == 4
    assert a.num_free(HUGE) == 1
    assert reclaim.complete(6) == 1
    assert a.num_free(HUGE) == 2 and reclaim.num_pending() == 0
    # release after the step already completed frees at once
    more = a.allocate(KV, 1, "r2")
    reclaim.release(KV, more, "r2", step=6)
    assert a.num_free(HUGE) == 2
    with pytest.raises(ValueError, match="completed after"):
        reclaim.complete(3)
    a.check_invariants()


def qwen35_geometry() -> PageGeometry:
    # 2 MiB expert = SSM = huge page; 32 KiB KV pages (64 per expert page), 48 KiB conv
    # states in 64 KiB slots (32 per expert page)
    shape = MemoryShape(
        40, 256, 2048, 512, 2, 256, 2, ssm_state_bytes=2**21, conv_state_bytes=49152
    )
    return PageGeometry.from_shape(shape)


def test_exact_ids_of_all_four_page_types_at_qwen35_sizes():
    a = PageAllocator(qwen35_geometry(), num_huge_pages=3)
    assert a.allocate(PageType.SSM, 1, "r") == [0]  # huge 0 is one SSM page
    assert a.allocate(PageType.CONV, 2, "r") == [32, 33]  # huge 1 -> expert 1 -> conv 32..63
    assert a.allocate(KV, 2, "r") == [128, 129]  # huge 2 -> expert 2 -> KV 128..191
    assert a.allocate(EXPERT, 1, "e") is None and a.allocate(PageType.SSM, 1, "s") is None
    assert (a.num_free(PageType.CONV), a.num_free(KV)) == (30, 62)
    # the conv slots' bytes: 64 KiB apart inside expert page 1 (bytes 2 MiB .. 4 MiB)
    assert [p * a.geometry.bytes_of(PageType.CONV) for p in (32, 33)] == [2**21, 2**21 + 2**16]
    a.check_invariants()
    a.free(PageType.CONV, [32, 33], "r")
    a.free(KV, [128, 129], "r")
    a.free(PageType.SSM, [0], "r")
    assert a.num_free(HUGE) == 3 and not a._splits
    a.check_invariants()


def test_byte_check_catches_a_page_that_overlaps_a_free_one():
    """The byte ranges are recomputed from page ids: a KV page recorded as owned while its
    bytes are still on a free list shows up as two pages at the same offset."""
    a = PageAllocator(qwen35_geometry(), num_huge_pages=1)
    a.allocate(KV, 1, "r")
    a._check_bytes_tile_the_pool()
    a._owner[KV][1] = "intruder"  # KV page 1 is also still free
    with pytest.raises(AssertionError, match="at byte 32768: expected one at byte 65536"):
        a._check_bytes_tile_the_pool()
