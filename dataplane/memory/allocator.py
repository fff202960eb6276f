"""Multi-level page allocator over integer page ids. No torch here.

Every page type numbers its pages in its own unit across the whole pool: page `p` of a
type with page size `S` covers bytes [p*S, (p+1)*S). So the parent of KV page `k` is
expert page `k // kv_per_expert`, and a page id times its page size is its byte offset
in the pool (what the kernels compute).

Levels (see geometry.py):

    huge page ──split──> expert pages ──split──> KV pages
              └─split──> SSM pages     └─split──> conv pages

Rules (the Rimuru paper's multi-level allocator):
  * A request for pages of type T first takes free T pages already carved out of a split
    parent (the caller's own parents first: same-request affinity, so a request's KV
    pages share parent expert pages and free together), then splits one free parent page,
    recursively; a huge page is never cut directly into KV pages.
  * Freeing runs the other way: when every child of a split page is free, the children
    merge back into their parent, recursively up to the huge page.
  * Exhaustion is expected: `allocate` returns None and changes nothing. Misuse (double
    free, freeing a page one does not own, unknown types) raises ValueError and changes
    nothing either: every call validates fully before it mutates.

Cached-free KV pages (prefix caching, engine/sched/prefix_cache.py): pages no request
holds whose contents a later request may reuse. `cache` hands them to the CACHED owner in
groups (one 16-token block of every attention layer) under a key the caller chose; the
group stays whole until a hit takes it back (`uncache`) or allocation drops it (`on_drop`
tells the caller). They are capacity, not waste:

  * `num_free(KV)` counts them, and `allocate(KV)` takes the truly free pages first
    (free KV pages, then free expert and huge pages split), and only then drops cached
    groups, least recently cached first.
  * `num_free(EXPERT)` counts an expert page whose KV pages are all free or cached (and
    at least one cached), and `allocate(EXPERT)` drops the cached groups in such a page,
    so it merges back, once truly free expert pages run out. So any expert placement
    (the adjuster's loads, loading slots, start-up residency) may take cached pages.

The rule this makes: a cached prefix is given up before any resident expert (a KV
shortfall is counted after them, so no expert is evicted while cached pages remain) and
for any expert that would be loaded. A cached prefix saves a prefill on its next hit, a
resident expert saves a copy on every step that routes to it; weighing the two by measured
value is not done. The pages counted are only those a caller handed over after their
last reader finished (memory/reclaim.py does so), so dropping one frees it at once.
Conv pages (hybrids) are cut from expert pages too, yet `num_free(CONV)` does not count
cached pages: prefix caching is off for hybrid models, so the two never meet.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass

from rimuru.dataplane.memory.geometry import PARENT, PageGeometry, PageType

Owner = Hashable
_AFFINITY_LOOKBACK = 4
PageKey = tuple[PageType, int]


@dataclass
class _Split:
    """A parent page cut into `child_type` children."""

    child_type: PageType
    free_children: list[int]  # min-heap of free child ids
    num_free: int


@dataclass
class _Stats:
    splits: int = 0
    merges: int = 0


class PageAllocator:
    """Hands out page ids of every type from `num_huge_pages` huge pages."""

    def __init__(self, geometry: PageGeometry, num_huge_pages: int):
        if num_huge_pages < 1:
            raise ValueError(
                f"the pool must hold at least one huge page ({geometry.huge_page_bytes} B); "
                f"got {num_huge_pages}: raise the memory budget"
            )
        self.geometry = geometry
        self.num_huge_pages = num_huge_pages
        self._free_huge: list[int] = list(range(num_huge_pages))  # min-heap
        self._free_huge_set: set[int] = set(self._free_huge)
        self._splits: dict[PageKey, _Split] = {}
        # Per child type: heap of parent ids that are split into that type and have a free
        # child. Lazy: entries are re-validated when popped; `_in_partial` avoids duplicates.
        self._partial: dict[PageType, list[int]] = {t: [] for t in PARENT}
        self._in_partial: dict[PageType, set[int]] = {t: set() for t in PARENT}
        self._num_free_children: dict[PageType, int] = {t: 0 for t in PARENT}
        # page type -> page id -> owner. Int keys per type, not (type, id) tuples: millions
        # of tuple keys would be GC-tracked objects that every full collection walks.
        self._owner: dict[PageType, dict[int, Owner]] = {t: {} for t in geometry.page_bytes}
        self._num_owned: dict[PageType, int] = {t: 0 for t in geometry.page_bytes}  # no split marks
        # owner -> child type -> parent id -> number of that owner's pages under it
        self._affinity: dict[Owner, dict[PageType, dict[int, int]]] = {}
        # Cached-free KV pages (module docstring): groups in LRU order (oldest first), the
        # group of each page, and per expert page the number of its KV pages cached.
        # `_mergeable`: expert pages split into KV pages that are all free or cached.
        self._cached_groups: OrderedDict[Hashable, tuple[int, ...]] = OrderedDict()
        self._cached_key: dict[int, Hashable] = {}
        self._cached_under: dict[int, int] = {}
        self._mergeable: set[int] = set()
        self.on_drop: Callable[[Hashable], None] | None = None  # told each group dropped
        self.stats = _Stats()

    # ------------------------------------------------------------------ queries
    def num_free(self, page_type: PageType) -> int:
        """Pages of this type that `allocate` could hand out right now, cached-free KV
        pages dropped where needed (module docstring) included."""
        self._check_type(page_type)
        if page_type is PageType.KV:
            return self._num_truly_free(page_type) + len(self._cached_key)
        if page_type is PageType.EXPERT:
            return self._num_truly_free(page_type) + len(self._mergeable)
        return self._num_truly_free(page_type)

    def _num_truly_free(self, page_type: PageType) -> int:
        """Pages of this type free without dropping any cached page."""
        if page_type is PageType.HUGE:
            return len(self._free_huge)
        parent = PARENT[page_type]
        ratio = self.geometry.ratio(page_type)
        return self._num_free_children[page_type] + self._num_truly_free(parent) * ratio

    def num_cached(self) -> int:
        """Cached-free KV pages."""
        return len(self._cached_key)

    def is_cached(self, key: Hashable) -> bool:
        return key in self._cached_groups

    def can_allocate(self, page_type: PageType, n: int) -> bool:
        return n <= self.num_free(page_type)

    def expert_pages_short(self, demand: Mapping[PageType, int]) -> int:
        """Expert pages that must come free before `demand` (pages of several types, taken
        together) fits; 0 exactly when allocating all of it in any order would succeed.

        The types share their parents, so checking each against `num_free` alone counts the
        same free page for several of them: a hybrid request's KV, SSM and conv pages may
        each fit while all three together do not (a round that reports no shortfall then
        moves nothing, and the request waits for ever). SSM pages are cut from whole huge
        pages, so what they lack is counted in whole huge pages: expert pages freed here
        and there do not make one."""
        g = self.geometry
        unknown = [t for t in demand if t not in PARENT or not g.has(t)]
        if unknown:
            raise ValueError(f"cannot count a demand for {unknown[0].value} pages here")

        def beyond_free_children(t: PageType) -> int:  # parents needed after free children
            # (cached pages count as free KV pages; for conv and SSM pages they are not
            # counted: they never meet, the module docstring says why)
            cached = len(self._cached_key) if t is PageType.KV else 0
            n = demand.get(t, 0) - self._num_free_children[t] - cached
            return -(-max(0, n) // g.ratio(t))

        experts = beyond_free_children(PageType.KV) if PageType.KV in demand else 0
        if PageType.CONV in demand:
            experts += beyond_free_children(PageType.CONV)
        from_huge = max(0, experts - self._num_free_children[PageType.EXPERT])
        per_huge = g.ratio(PageType.EXPERT)
        if PageType.SSM not in demand or beyond_free_children(PageType.SSM) == 0:
            return max(0, from_huge - len(self._free_huge) * per_huge)
        huge = beyond_free_children(PageType.SSM) + -(-from_huge // per_huge)
        return max(0, huge - len(self._free_huge)) * per_huge

    def owner_of(self, page_type: PageType, page_id: int) -> Owner | None:
        return self._owner.get(page_type, {}).get(page_id)

    def owned_pages(self):
        """(type, page id, owner) of every page handed out (including split marks)."""
        for t, owners in self._owner.items():
            for p, o in owners.items():
                yield t, p, o

    def num_owned(self, page_type: PageType) -> int:
        return self._num_owned[page_type]

    # ------------------------------------------------------------------ allocate
    def allocate(self, page_type: PageType, n: int, owner: Owner) -> list[int] | None:
        """All-or-nothing: n pages of `page_type` for `owner`, or None if they don't fit."""
        self._check_type(page_type)
        if page_type is PageType.HUGE:
            raise ValueError("huge pages are never handed out whole; allocate expert/SSM pages")
        if n < 0:
            raise ValueError(f"cannot allocate a negative number of pages ({n})")
        if owner is None:
            raise ValueError("owner must not be None")
        if n > self.num_free(page_type):
            return None
        self._drop_cached_for(page_type, n)
        pages: list[int] = []
        while len(pages) < n:
            pages += self._take_from_one_parent(page_type, n - len(pages), owner)
        return pages

    def _take_one(self, page_type: PageType, owner: Owner) -> int:
        return self._take_from_one_parent(page_type, 1, owner)[0]

    def _take_from_one_parent(self, page_type: PageType, n: int, owner: Owner) -> list[int]:
        """Up to n pages from the parent `_pick_parent` chooses (lowest ids first)."""
        parent_id = self._pick_parent(page_type, owner)
        split = self._splits[(PARENT[page_type], parent_id)]
        k = min(n, split.num_free)
        heap = split.free_children
        taken = [heapq.heappop(heap) for _ in range(k)]
        split.num_free -= k
        self._num_free_children[page_type] -= k
        owners = self._owner[page_type]
        for page_id in taken:
            owners[page_id] = owner
        if owner is not _SPLIT:
            self._num_owned[page_type] += k
        by_parent = self._affinity.setdefault(owner, {}).setdefault(page_type, {})
        by_parent[parent_id] = by_parent.get(parent_id, 0) + k
        if page_type is PageType.KV:
            self._update_mergeable(parent_id)
        return taken

    def _pick_parent(self, page_type: PageType, owner: Owner) -> int:
        """A split parent with a free child of `page_type`; splits a new one if needed."""
        parent_type = PARENT[page_type]
        # 1. affinity: a parent this owner already has pages under, most recent first (a
        #    growing request fills its newest parent; older ones are usually full, so only
        #    the last few are looked at). Split marks have no affinity.
        if owner is not _SPLIT:
            by_parent = self._affinity.get(owner, {}).get(page_type, {})
            for parent_id in itertools.islice(reversed(by_parent), _AFFINITY_LOOKBACK):
                split = self._splits.get((parent_type, parent_id))
                if split is not None and split.num_free > 0:
                    return parent_id
        # 2. the lowest already-split parent with a free child
        heap, members = self._partial[page_type], self._in_partial[page_type]
        while heap:
            parent_id = heap[0]
            split = self._splits.get((parent_type, parent_id))
            if split is not None and split.child_type is page_type and split.num_free > 0:
                return parent_id
            heapq.heappop(heap)
            members.discard(parent_id)
        # 3. split a free parent page (taking it from its own parent first)
        if parent_type is PageType.HUGE:
            parent_id = heapq.heappop(self._free_huge)
            self._free_huge_set.discard(parent_id)
        else:
            parent_id = self._take_one(parent_type, owner=_SPLIT)
        self._split(parent_type, parent_id, page_type)
        return parent_id

    def _split(self, parent_type: PageType, parent_id: int, child_type: PageType) -> None:
        ratio = self.geometry.ratio(child_type)
        first = parent_id * ratio
        # range() is already a valid min-heap
        self._splits[(parent_type, parent_id)] = _Split(
            child_type, list(range(first, first + ratio)), ratio
        )
        self._num_free_children[child_type] += ratio
        self._mark_partial(child_type, parent_id)
        self.stats.splits += 1

    def _mark_partial(self, child_type: PageType, parent_id: int) -> None:
        if parent_id not in self._in_partial[child_type]:
            heapq.heappush(self._partial[child_type], parent_id)
            self._in_partial[child_type].add(parent_id)

    # ------------------------------------------------------------------ free
    def free(self, page_type: PageType, page_ids: Iterable[int], owner: Owner) -> None:
        """Return pages; merges parents whose children are all free. Validates first."""
        ids = self._validated(page_type, page_ids, owner)
        for page_id in ids:
            self._release_one(page_type, page_id, owner)

    def transfer(
        self, page_type: PageType, page_ids: Iterable[int], owner: Owner, new_owner: Owner
    ) -> None:
        """Hand owned pages to another owner (e.g. a deferred-reclaim pending list)."""
        if new_owner is None or new_owner is CACHED:
            raise ValueError(f"cannot transfer pages to {new_owner!r} (cache them instead)")
        ids = self._validated(page_type, page_ids, owner)
        for page_id in ids:
            self._owner[page_type][page_id] = new_owner
            self._move_affinity(
                page_type, page_id // self.geometry.ratio(page_type), owner, new_owner
            )

    def _validated(self, page_type: PageType, page_ids: Iterable[int], owner: Owner) -> list[int]:
        self._check_type(page_type)
        ids = list(page_ids)
        if len(set(ids)) != len(ids):
            raise ValueError(f"the same {page_type.value} page appears twice in one call: {ids}")
        for page_id in ids:
            held_by = self._owner[page_type].get(page_id, _FREE)
            if held_by is _FREE:
                raise ValueError(
                    f"{page_type.value} page {page_id} is not allocated (double free or a page "
                    f"id that was never handed out)"
                )
            if held_by != owner:
                raise ValueError(
                    f"{page_type.value} page {page_id} belongs to {held_by!r}, not {owner!r}"
                )
        return ids

    def _release_one(self, page_type: PageType, page_id: int, owner: Owner) -> None:
        del self._owner[page_type][page_id]
        if owner is not _SPLIT and owner is not CACHED:
            self._num_owned[page_type] -= 1
        parent_type = PARENT[page_type]
        parent_id = page_id // self.geometry.ratio(page_type)
        self._drop_affinity(owner, page_type, parent_id)
        split = self._splits[(parent_type, parent_id)]
        heapq.heappush(split.free_children, page_id)
        split.num_free += 1
        self._num_free_children[page_type] += 1
        if split.num_free == self.geometry.ratio(page_type):
            self._merge(parent_type, parent_id, page_type)
        else:
            self._mark_partial(page_type, parent_id)
        if page_type is PageType.KV:
            self._update_mergeable(parent_id)

    def _merge(self, parent_type: PageType, parent_id: int, child_type: PageType) -> None:
        """All children free: the parent page is whole again and itself freed upward."""
        del self._splits[(parent_type, parent_id)]
        self._num_free_children[child_type] -= self.geometry.ratio(child_type)
        self.stats.merges += 1
        if parent_type is PageType.HUGE:
            heapq.heappush(self._free_huge, parent_id)
            self._free_huge_set.add(parent_id)
        else:
            self._release_one(parent_type, parent_id, _SPLIT)

    # ------------------------------------------------------------------ cached-free pages
    def cache(
        self, page_type: PageType, page_ids: Iterable[int], owner: Owner, key: Hashable
    ) -> None:
        """`owner`'s KV pages become one cached-free group under `key` (most recent)."""
        if page_type is not PageType.KV:
            raise ValueError(f"only KV pages are cached, not {page_type.value} pages")
        if key in self._cached_groups:
            raise ValueError(f"a group is already cached under {key!r}")
        ids = self._validated(page_type, page_ids, owner)
        if not ids:
            raise ValueError("a cached group needs at least one page")
        ratio = self.geometry.ratio(page_type)
        for page_id in ids:
            self._owner[page_type][page_id] = CACHED
            self._num_owned[page_type] -= 1
            self._move_affinity(page_type, page_id // ratio, owner, CACHED)
            self._cached_key[page_id] = key
            parent_id = page_id // ratio
            self._cached_under[parent_id] = self._cached_under.get(parent_id, 0) + 1
            self._update_mergeable(parent_id)
        self._cached_groups[key] = tuple(ids)

    def uncache(self, key: Hashable, new_owner: Owner) -> tuple[int, ...]:
        """A hit: the group cached under `key` goes to `new_owner`; its pages."""
        if new_owner is None or new_owner is CACHED or new_owner is _SPLIT:
            raise ValueError(f"cannot hand cached pages to {new_owner!r}")
        ids = self._cached_groups.pop(key, None)
        if ids is None:
            raise ValueError(f"nothing is cached under {key!r}")
        ratio = self.geometry.ratio(PageType.KV)
        for page_id in ids:
            self._owner[PageType.KV][page_id] = new_owner
            self._num_owned[PageType.KV] += 1
            self._move_affinity(PageType.KV, page_id // ratio, CACHED, new_owner)
            self._forget_cached(page_id)
        return ids

    def _forget_cached(self, page_id: int) -> None:
        del self._cached_key[page_id]
        parent_id = page_id // self.geometry.ratio(PageType.KV)
        self._cached_under[parent_id] -= 1
        if not self._cached_under[parent_id]:
            del self._cached_under[parent_id]
        self._update_mergeable(parent_id)

    def _drop_group(self, key: Hashable) -> None:
        for page_id in self._cached_groups.pop(key):
            self._forget_cached(page_id)
            self._release_one(PageType.KV, page_id, CACHED)
        if self.on_drop is not None:
            self.on_drop(key)

    def _drop_cached_for(self, page_type: PageType, n: int) -> None:
        """Drop cached groups until `n` pages of `page_type` are truly free (`allocate`
        has checked that they will be): KV takes the least recently cached groups; an
        expert page, every group in the mergeable page holding the oldest cached group."""
        if page_type is PageType.KV:
            while self._num_truly_free(page_type) < n:
                self._drop_group(next(iter(self._cached_groups)))
        elif page_type is PageType.EXPERT:
            ratio = self.geometry.ratio(PageType.KV)
            while self._num_truly_free(page_type) < n:
                parent_id = next(
                    p // ratio
                    for ids in self._cached_groups.values()
                    for p in ids
                    if p // ratio in self._mergeable
                )
                children = range(parent_id * ratio, (parent_id + 1) * ratio)
                keys = dict.fromkeys(self._cached_key[c] for c in children if c in self._cached_key)
                for key in keys:
                    self._drop_group(key)

    def _update_mergeable(self, parent_id: int) -> None:
        split = self._splits.get((PageType.EXPERT, parent_id))
        cached = self._cached_under.get(parent_id, 0)
        ratio = self.geometry.ratio(PageType.KV)
        if split is not None and cached and split.num_free + cached == ratio:
            self._mergeable.add(parent_id)
        else:
            self._mergeable.discard(parent_id)

    def _move_affinity(
        self, page_type: PageType, parent_id: int, owner: Owner, new_owner: Owner
    ) -> None:
        self._drop_affinity(owner, page_type, parent_id)
        by_parent = self._affinity.setdefault(new_owner, {}).setdefault(page_type, {})
        by_parent[parent_id] = by_parent.get(parent_id, 0) + 1

    def _drop_affinity(self, owner: Owner, page_type: PageType, parent_id: int) -> None:
        per_type = self._affinity[owner]
        by_parent = per_type[page_type]
        by_parent[parent_id] -= 1
        if by_parent[parent_id] == 0:
            del by_parent[parent_id]
            if not by_parent:
                del per_type[page_type]
                if not per_type:
                    del self._affinity[owner]

    def _check_type(self, page_type: PageType) -> None:
        if not isinstance(page_type, PageType) or not self.geometry.has(page_type):
            known = ", ".join(t.value for t in self.geometry.page_bytes)
            raise ValueError(f"unknown page type {page_type!r} for this pool (known: {known})")

    # ------------------------------------------------------------------ invariants
    def check_invariants(self) -> None:
        """Every byte of the pool is in exactly one state: free, owned, or split further;
        every page is free or owned exactly once; affinity counts match the owners."""
        g = self.geometry
        total = 0
        seen_free_huge = set()
        for h in range(self.num_huge_pages):
            is_free = h in self._free_huge_set
            is_split = (PageType.HUGE, h) in self._splits
            if is_free == is_split:
                raise AssertionError(f"huge page {h}: free={is_free} split={is_split}")
            if is_free:
                seen_free_huge.add(h)
                total += g.huge_page_bytes
            else:
                total += self._check_subtree(PageType.HUGE, h)
        if total != self.num_huge_pages * g.huge_page_bytes:
            raise AssertionError(f"bytes not conserved: {total}")
        if set(self._free_huge) != seen_free_huge:
            raise AssertionError("free huge heap disagrees with the free set")
        owned_splits = {(t, p) for t, d in self._owner.items() for p, v in d.items() if v is _SPLIT}
        split_children = {k for k in self._splits if k[0] is not PageType.HUGE}
        for t, owners in self._owner.items():
            held = sum(1 for o in owners.values() if o is not _SPLIT and o is not CACHED)
            if self._num_owned[t] != held:
                raise AssertionError(f"owned-page counter of {t.value} pages is off")
        if owned_splits != split_children:
            raise AssertionError("split marks disagree with split pages")
        counts: dict[tuple[Owner, PageType, int], int] = {}
        for t, p, o in self.owned_pages():
            key = (o, t, p // g.ratio(t))
            counts[key] = counts.get(key, 0) + 1
        flat = {
            (o, t, parent): n
            for o, per_type in self._affinity.items()
            for t, by_parent in per_type.items()
            for parent, n in by_parent.items()
        }
        if flat != counts:
            raise AssertionError("affinity counts disagree with page owners")
        self._check_cached()
        self._check_bytes_tile_the_pool()

    def _check_cached(self) -> None:
        """The cached groups are exactly the pages CACHED owns, each in one group; the
        per-expert-page counts and the mergeable set follow from them."""
        kv_owners = self._owner.get(PageType.KV, {})
        owned = {p for p, o in kv_owners.items() if o is CACHED}
        grouped = [p for ids in self._cached_groups.values() for p in ids]
        if len(grouped) != len(set(grouped)) or set(grouped) != owned:
            raise AssertionError("cached groups disagree with the pages CACHED owns")
        keys = {p: k for k, ids in self._cached_groups.items() for p in ids}
        if keys != self._cached_key:
            raise AssertionError("a cached page's group key is wrong")
        if not owned:
            if self._cached_under or self._mergeable:
                raise AssertionError("cache counts left with nothing cached")
            return
        ratio = self.geometry.ratio(PageType.KV)
        under: dict[int, int] = {}
        for p in owned:
            under[p // ratio] = under.get(p // ratio, 0) + 1
        if under != self._cached_under:
            raise AssertionError("cached pages per expert page are off")
        mergeable = {
            parent
            for parent, n in under.items()
            if self._splits[(PageType.EXPERT, parent)].num_free + n == ratio
        }
        if mergeable != self._mergeable:
            raise AssertionError(
                f"mergeable expert pages {sorted(self._mergeable)}, not {sorted(mergeable)}"
            )

    def _check_bytes_tile_the_pool(self) -> None:
        """Byte ranges, from ids alone: page p of slot size S covers [p*S, (p+1)*S). The
        free and owned pages (split marks excluded: their bytes are their children's) must
        tile the pool exactly, so no two live pages share a byte and none is lost."""
        g = self.geometry
        ranges = [(h * g.huge_page_bytes, g.huge_page_bytes, "free huge") for h in self._free_huge]
        for split in self._splits.values():
            size = g.bytes_of(split.child_type)
            ranges += [(c * size, size, "free") for c in split.free_children]
        for t, p, o in self.owned_pages():
            if o is not _SPLIT:
                ranges.append((p * g.bytes_of(t), g.bytes_of(t), f"{t.value} page {p}"))
        end = 0
        for start, size, what in sorted(ranges):
            if start != end:
                raise AssertionError(f"{what} at byte {start}: expected one at byte {end}")
            end = start + size
        if end != self.num_huge_pages * g.huge_page_bytes:
            raise AssertionError(f"pages end at byte {end}, not at the end of the pool")

    def _check_subtree(self, page_type: PageType, page_id: int) -> int:
        split = self._splits[(page_type, page_id)]
        ratio = self.geometry.ratio(split.child_type)
        children = range(page_id * ratio, (page_id + 1) * ratio)
        free = set(split.free_children)
        if len(free) != len(split.free_children) or len(free) != split.num_free:
            raise AssertionError(f"{page_type.value} page {page_id}: free list corrupt")
        if not free <= set(children) or split.num_free == ratio:
            raise AssertionError(f"{page_type.value} page {page_id}: should have merged or bad ids")
        total = 0
        for c in children:
            owned = c in self._owner[split.child_type]
            if owned == (c in free):
                raise AssertionError(f"{split.child_type.value} page {c}: free and owned disagree")
            if self._owner[split.child_type].get(c) is _SPLIT:
                total += self._check_subtree(split.child_type, c)
            else:
                total += self.geometry.bytes_of(split.child_type)
        return total


class _Marker:
    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


_FREE = _Marker("<free>")
_SPLIT = _Marker("<split>")  # owner of a page that is itself cut into children
CACHED = _Marker("<cached>")  # owner of cached-free KV pages (module docstring)
