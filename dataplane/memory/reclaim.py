"""Deferred reclaim: pages released while a forward pass may still read them.

An evicted expert's pages or a finished request's KV pages can still be read by the
forward pass that is in flight (on CUDA the host runs ahead of the device). They are
handed to a pending owner tagged with the step that last used them, and become free only
once that step is marked complete — on CUDA when the event recorded after its forward
has fired, on CPU right after the forward returns (same code path, just synchronous).

A KV page a prefix cache keeps (`cache_key`) goes the same way, and then into the
allocator's cached-free groups instead of its free pages: allocation may drop a cached
page at once, so it must not be cached before its last reader has finished.

Stream-ordered (async scheduling): every reader and writer of pool pages is queued on one
device stream, or, the expert copies, waits for it first; a page released is then free at
once, since whatever reuses it is queued after the forward that may still read it.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass

from rimuru.dataplane.memory.allocator import Owner, PageAllocator
from rimuru.dataplane.memory.geometry import PageType


@dataclass(frozen=True)
class Pending:
    """Owner of pages waiting for `step` to complete."""

    step: int


class DeferredReclaim:
    def __init__(self, allocator: PageAllocator, *, stream_ordered: bool = False):
        self.allocator = allocator
        self.stream_ordered = stream_ordered
        # step -> (page type, pages, cache key or None) released after it
        self._pending: dict[int, list[tuple[PageType, list[int], Hashable | None]]] = {}
        self.last_completed_step = -1

    def release(
        self,
        page_type: PageType,
        page_ids: Iterable[int],
        owner: Owner,
        step: int,
        cache_key: Hashable | None = None,
    ) -> None:
        """Pages stop belonging to `owner` now and become free after `step` completes
        (with `cache_key`: one cached-free group under that key, memory/allocator.py)."""
        ids = list(page_ids)
        if not ids:
            return
        if self.stream_ordered or step <= self.last_completed_step:
            # Nothing in flight can read them any more, or reuse is queued after it.
            self._free(page_type, ids, owner, cache_key)
            return
        self.allocator.transfer(page_type, ids, owner, Pending(step))
        self._pending.setdefault(step, []).append((page_type, ids, cache_key))

    def _free(
        self, page_type: PageType, ids: list[int], owner: Owner, key: Hashable | None
    ) -> None:
        if key is None:
            self.allocator.free(page_type, ids, owner)
        else:
            self.allocator.cache(page_type, ids, owner, key)

    def is_pending(self, cache_key: Hashable) -> bool:
        """Whether a group released under `cache_key` still waits for its step."""
        return any(key == cache_key for batch in self._pending.values() for _, _, key in batch)

    def complete(self, step: int) -> int:
        """Mark every step <= `step` complete; returns how many pages became free."""
        if step < self.last_completed_step:
            raise ValueError(f"step {step} completed after step {self.last_completed_step}")
        freed = 0
        for s in sorted(k for k in self._pending if k <= step):
            for page_type, ids, key in self._pending.pop(s):
                self._free(page_type, ids, Pending(s), key)
                freed += len(ids)
        self.last_completed_step = step
        return freed

    def num_pending(self, page_type: PageType | None = None) -> int:
        return sum(
            len(ids)
            for batches in self._pending.values()
            for t, ids, _ in batches
            if page_type is None or t is page_type
        )
