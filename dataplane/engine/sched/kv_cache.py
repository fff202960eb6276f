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

With a prefix cache (prefix_cache.py; attention-only models), a request admitted with no
pages starts from the longest cached chain of its prompt's full blocks (`cached_prefix`,
then `allocate_slots(..., hit)` holds them and counts their tokens computed); its full
prompt blocks become shared once their forward is launched (`cache_blocks`); `free` lets go
of the shared ones (cached-free once no request holds them) and releases the rest. Cached-free
pages count as free KV pages (memory/allocator.py), so a shortfall is what remains after
all of them would be dropped.
"""

from __future__ import annotations

import math

from rimuru.dataplane.engine.sched.prefix_cache import NO_HIT, PrefixCache, PrefixHit
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
        prefix_cache: PrefixCache | None = None,
    ):
        """`num_layers`: layers with a KV cache; `num_state_layers`: GDN layers (0: none);
        `prefix_cache`: None = prefix caching off (it needs `num_state_layers` 0)."""
        if prefix_cache is not None and num_state_layers:
            raise ValueError("prefix caching covers attention layers only, not GDN states")
        self.allocator = allocator
        self.reclaim = reclaim
        self.num_layers = num_layers
        self.block_size = block_size
        self.num_state_layers = num_state_layers
        self.prefix_cache = prefix_cache

    def cached_prefix(self, request: Request) -> PrefixHit:
        """What a request with no pages yet may start from (NO_HIT: nothing, or caching
        off). Changes nothing: `allocate_slots` takes it."""
        if self.prefix_cache is None or not self._first_admission(request):
            return NO_HIT
        return self.prefix_cache.lookup(request)

    def num_pages_needed(
        self, request: Request, num_new_tokens: int, hit: PrefixHit = NO_HIT
    ) -> int:
        """KV pages `request` must add to hold `num_new_tokens` more tokens (after the
        hit's, which it holds without new pages)."""
        computed = request.num_computed_tokens + hit.num_tokens
        total_blocks = math.ceil((computed + num_new_tokens) / self.block_size)
        have = len(request.block_table) + len(hit.blocks)
        return max(0, total_blocks - have) * self.num_layers

    def num_state_pages_needed(self, request: Request) -> int:
        """SSM pages (and as many conv pages) the request must take before it runs."""
        return self.num_state_layers if request.state_pages is None else 0

    def allocate_slots(
        self, request: Request, num_new_tokens: int, hit: PrefixHit = NO_HIT
    ) -> bool:
        """Grow the request's block table (and take its state pages on its first step);
        False, with nothing changed, if any of the pages are short. `hit`: what
        `cached_prefix` found, held first and counted computed."""
        needed = self.num_pages_needed(request, num_new_tokens, hit)
        if self.prefix_cache is not None and self._first_admission(request):
            # Checked before the hit is held, so the allocation below cannot fail (KV
            # pages only: no states with a prefix cache); held first, so it drops none of
            # the hit's cached pages.
            if needed > self.allocator.num_free(PageType.KV) - hit.num_cached_free_pages:
                return False
            self._take_hit(request, hit)
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

    @staticmethod
    def _first_admission(request: Request) -> bool:
        """No pages and nothing computed: admitted now, or again after a preemption."""
        return not len(request.block_table) and not request.num_computed_tokens

    def _take_hit(self, request: Request, hit: PrefixHit) -> None:
        self.prefix_cache.take(hit, request.num_tokens)
        for block in hit.blocks:
            request.block_table.append_block(list(block.pages))
        request.num_shared_blocks = len(hit.blocks)
        request.num_computed_tokens = hit.num_tokens
        if request.num_cached_tokens is None:
            request.num_cached_tokens = hit.num_tokens

    def cache_blocks(self, request: Request) -> None:
        """The request's forward is launched: its full prompt blocks computed so far
        become shared, in order (every step that could read them is queued after it)."""
        cache = self.prefix_cache
        if cache is None or request.shares_no_more:
            return
        if request.num_shared_blocks == len(request.block_hashes):  # decode: all named
            return
        full = min(len(request.block_hashes), request.num_computed_tokens // self.block_size)
        table = request.block_table.array()
        for i in range(request.num_shared_blocks, full):
            if not cache.register(request.block_hashes[i], table[i].tolist(), request.request_id):
                request.shares_no_more = True
                return
            request.num_shared_blocks += 1

    def pages_lacking(self, request: Request, num_new_tokens: int, hit: PrefixHit = NO_HIT) -> int:
        """What `allocate_slots` would lack, in KV pages: 0 exactly when it would succeed.
        The KV, SSM and conv pages are counted together (they are cut from the same free
        pages), in the expert pages the adjuster frees."""
        needed = self.num_pages_needed(request, num_new_tokens, hit)
        num_states = self.num_state_pages_needed(request)
        if not num_states:
            free = self.allocator.num_free(PageType.KV) - hit.num_cached_free_pages
            return max(0, needed - free)
        demand = {PageType.KV: needed, PageType.SSM: num_states, PageType.CONV: num_states}
        short = self.allocator.expert_pages_short(demand)
        return short * self.allocator.geometry.kv_pages_per_expert_page

    def free(self, request: Request, last_step: int) -> None:
        """Release all of the request's pages once `last_step` (which may read them) ends;
        its shared blocks are let go of instead (cached-free once no one holds them)."""
        num_shared, request.num_shared_blocks = request.num_shared_blocks, 0
        request.shares_no_more = False
        # the chain's tail first: it becomes the least recently used, so allocation drops
        # a chain from its end, and what stays cached is still a reachable prefix (vLLM)
        for h in reversed(request.block_hashes[:num_shared]):
            self.prefix_cache.release(h, last_step)
        pages = request.block_table.pop_blocks()[num_shared * self.num_layers :]
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
        """The KV and state pages requests hold now, in expert pages (by bytes; a shared
        block counted once)."""
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
