"""Who owns the pool's pages, checked against who should: the ownership half of the
engine's check_invariants (tests call it) and its leak count (benchmarks check it is 0
once every request finished). The allocator checks its own bookkeeping; these check
that its owners are the engine's live parts.
"""

from __future__ import annotations

from collections.abc import Collection

from rimuru.dataplane.engine.experts.residency_table import ResidencyTable
from rimuru.dataplane.engine.graphs.cuda_graphs import GRAPH_PADDING
from rimuru.dataplane.engine.sched.prefix_cache import PREFIX_OWNER
from rimuru.dataplane.engine.sched.request import Request
from rimuru.dataplane.memory.allocator import CACHED, PageAllocator
from rimuru.dataplane.memory.geometry import PageGeometry, PageType
from rimuru.dataplane.memory.reclaim import DeferredReclaim, Pending

REQUEST_PAGES = (PageType.KV, PageType.SSM, PageType.CONV)  # what requests own


def check_page_owners(
    allocator: PageAllocator,
    requests: Collection[Request],
    residency: ResidencyTable,
    *,
    num_state_layers: int,
    pages_per_expert: int,
) -> None:
    """KV and state pages owned only by live requests, pending reclaim or the CUDA graphs'
    padding; expert pages exactly the resident experts' and the loading slots the
    residency needs. Raises AssertionError naming what is wrong."""
    live = {r.request_id for r in requests if not r.status.finished}
    owners = {o for t, _, o in allocator.owned_pages() if t in REQUEST_PAGES}
    # (held shared blocks and cached-free pages: prefix_cache.py checks them)
    leaked = owners - live - {GRAPH_PADDING, PREFIX_OWNER, CACHED}
    leaked = {o for o in leaked if not isinstance(o, Pending)}
    if leaked:
        raise AssertionError(
            f"KV or state pages leaked by finished requests: {sorted(map(str, leaked))}"
        )
    for r in requests:  # a running hybrid request holds one of each
        held = r.state_pages
        if held is not None and not (len(held.ssm) == len(held.conv) == num_state_layers):
            raise AssertionError(f"{r.request_id} holds state pages {held}")
    expected = residency.num_resident() * pages_per_expert
    expert_owned = sum(
        1
        for t, _, o in allocator.owned_pages()
        if t is PageType.EXPERT and isinstance(o, tuple) and o[:1] == ("expert",)
    )
    if expected != expert_owned:
        raise AssertionError(f"{expert_owned} expert pages owned, {expected} expected")
    slots = residency.loading_slots
    if slots is not None:  # a loading slot per expert offloaded, as many as a layer needs
        slot_owned = sum(
            1
            for t, _, o in allocator.owned_pages()
            if t is PageType.EXPERT and isinstance(o, tuple) and o[:1] == ("loading slot",)
        )
        if len(slots.slots) != slots.slots_needed() or slot_owned != 3 * len(slots.slots):
            raise AssertionError(
                f"{len(slots.slots)} loading slots ({slot_owned} pages) for a residency "
                f"that needs {slots.slots_needed()}"
            )


def num_leaked_request_pages(
    allocator: PageAllocator, reclaim: DeferredReclaim, geometry: PageGeometry, num_pad_pages: int
) -> int:
    """After all requests finished: KV and state pages still owned or pending, less the
    CUDA graphs' padding pages (should be 0)."""
    owned = -num_pad_pages
    for t in REQUEST_PAGES:
        if geometry.has(t):
            owned += allocator.num_owned(t) + reclaim.num_pending(t)
    return owned
