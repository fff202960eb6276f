"""KV cache manager: a request's 16-token blocks in the pool's KV pages.

A block holds one KV page per layer (see memory/geometry.py for why pages are per layer),
so a block costs `num_layers` KV pages. Check/act pairs as in vLLM: `allocate_slots`
returns None when the pages are not there, and the scheduler decides whom to preempt.
"""

from __future__ import annotations

import math

from rimuru.dataplane.engine.request import Request
from rimuru.dataplane.memory.allocator import PageAllocator
from rimuru.dataplane.memory.geometry import PageType
from rimuru.dataplane.memory.reclaim import DeferredReclaim


class KVCacheManager:
    def __init__(
        self, allocator: PageAllocator, reclaim: DeferredReclaim, num_layers: int, block_size: int
    ):
        self.allocator = allocator
        self.reclaim = reclaim
        self.num_layers = num_layers
        self.block_size = block_size

    def num_pages_needed(self, request: Request, num_new_tokens: int) -> int:
        """KV pages `request` must add to hold `num_new_tokens` more tokens."""
        total_blocks = math.ceil((request.num_computed_tokens + num_new_tokens) / self.block_size)
        return max(0, total_blocks - len(request.block_table)) * self.num_layers

    def allocate_slots(self, request: Request, num_new_tokens: int) -> bool:
        """Grow the request's block table; False (and nothing changed) if pages are short."""
        needed = self.num_pages_needed(request, num_new_tokens)
        if needed == 0:
            return True
        pages = self.allocator.allocate(PageType.KV, needed, owner=request.request_id)
        if pages is None:
            return False
        for i in range(0, needed, self.num_layers):
            request.block_table.append_block(pages[i : i + self.num_layers])
        return True

    def free(self, request: Request, last_step: int) -> None:
        """Release all of the request's pages once `last_step` (which may read them) ends."""
        pages = request.block_table.pop_blocks()
        self.reclaim.release(PageType.KV, pages, request.request_id, last_step)

    @property
    def num_free_pages(self) -> int:
        return self.allocator.num_free(PageType.KV)

    def shortfall_in_expert_pages(self, kv_pages_short: int) -> int:
        per_expert = self.allocator.geometry.kv_pages_per_expert_page
        return math.ceil(kv_pages_short / per_expert)
