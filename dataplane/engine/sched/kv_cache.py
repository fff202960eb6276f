"""The cache manager: a request's 16-token KV blocks and, for a hybrid model, its Gated
DeltaNet state pages, all in the pool.

Two layer groups, as vLLM's KVCacheSpec / MambaSpec split them:

    attention layers  per 16-token block, one KV page per attention layer (see
                      memory/geometry.py for why pages are per layer): grows with the request
    GDN layers        per request, one SSM page and one conv page per GDN layer: fixed size,
                      taken with the request's first block, kept until it finishes or is
                      preempted (preemption recomputes: the states are rebuilt from zeros)

Check/act pairs as in vLLM: `allocate_slots` returns False (and changes nothing) when the
pages are not there, and the scheduler decides whom to preempt; `pages_lacking` says by how
much, in KV pages, the unit the adjuster converts to expert pages.
"""

from __future__ import annotations

import math

from rimuru.dataplane.engine.sched.request import Request
from rimuru.dataplane.memory.allocator import PageAllocator
from rimuru.dataplane.memory.geometry import PageType
from rimuru.dataplane.memory.reclaim import DeferredReclaim
from rimuru.dataplane.memory.tables import StatePages


class KVCacheManager:
    def __init__(
        self,
        allocator: PageAllocator,
        reclaim: DeferredReclaim,
        num_layers: int,
        block_size: int,
        num_state_layers: int = 0,
    ):
        """`num_layers`: layers with a KV cache; `num_state_layers`: GDN layers (0: none)."""
        self.allocator = allocator
        self.reclaim = reclaim
        self.num_layers = num_layers
        self.block_size = block_size
        self.num_state_layers = num_state_layers

    def num_pages_needed(self, request: Request, num_new_tokens: int) -> int:
        """KV pages `request` must add to hold `num_new_tokens` more tokens."""
        total_blocks = math.ceil((request.num_computed_tokens + num_new_tokens) / self.block_size)
        return max(0, total_blocks - len(request.block_table)) * self.num_layers

    def num_state_pages_needed(self, request: Request) -> int:
        """SSM pages (and as many conv pages) the request must take before it runs."""
        return self.num_state_layers if request.state_pages is None else 0

    def allocate_slots(self, request: Request, num_new_tokens: int) -> bool:
        """Grow the request's block table (and take its state pages on its first step);
        False, with nothing changed, if any of the pages are short."""
        needed = self.num_pages_needed(request, num_new_tokens)
        num_states = self.num_state_pages_needed(request)
        if needed == 0 and num_states == 0:
            return True
        owner = request.request_id
        taken: list[tuple[PageType, list[int]]] = []
        for page_type, n in ((PageType.KV, needed), (PageType.SSM, num_states),
                             (PageType.CONV, num_states)):  # fmt: skip
            if n == 0:
                continue
            pages = self.allocator.allocate(page_type, n, owner=owner)
            if pages is None:
                for t, ids in taken:  # never read by any forward: free at once
                    self.allocator.free(t, ids, owner)
                return False
            taken.append((page_type, pages))
        got = dict(taken)
        kv = got.get(PageType.KV, [])
        for i in range(0, len(kv), self.num_layers):
            request.block_table.append_block(kv[i : i + self.num_layers])
        if num_states:
            request.state_pages = StatePages(tuple(got[PageType.SSM]), tuple(got[PageType.CONV]))
        return True

    def pages_lacking(self, request: Request, num_new_tokens: int) -> int:
        """What `allocate_slots` would lack, in KV pages: 0 exactly when it would succeed.
        The KV, SSM and conv pages are counted together (they are cut from the same free
        pages), in the expert pages the adjuster frees."""
        needed = self.num_pages_needed(request, num_new_tokens)
        num_states = self.num_state_pages_needed(request)
        if not num_states:
            return max(0, needed - self.allocator.num_free(PageType.KV))
        demand = {PageType.KV: needed, PageType.SSM: num_states, PageType.CONV: num_states}
        short = self.allocator.expert_pages_short(demand)
        return short * self.allocator.geometry.kv_pages_per_expert_page

    def free(self, request: Request, last_step: int) -> None:
        """Release all of the request's pages once `last_step` (which may read them) ends."""
        pages = request.block_table.pop_blocks()
        owner = request.request_id
        self.reclaim.release(PageType.KV, pages, owner, last_step)
        states, request.state_pages = request.state_pages, None
        if states is not None:
            self.reclaim.release(PageType.SSM, states.ssm, owner, last_step)
            self.reclaim.release(PageType.CONV, states.conv, owner, last_step)

    @property
    def num_free_pages(self) -> int:
        return self.allocator.num_free(PageType.KV)

    def held_in_expert_pages(self) -> float:
        """The KV and state pages requests hold now, in expert pages (by bytes)."""
        g = self.allocator.geometry
        held = sum(
            self.allocator.num_owned(t) * g.bytes_of(t)
            for t in (PageType.KV, PageType.SSM, PageType.CONV)
            if g.has(t)
        )
        return held / g.expert_page_bytes

    def shortfall_in_expert_pages(self, kv_pages_short: int) -> int:
        per_expert = self.allocator.geometry.kv_pages_per_expert_page
        return math.ceil(kv_pages_short / per_expert)
