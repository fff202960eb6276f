"""Automatic prefix caching for attention layers, in vLLM V1's manner.

A full 16-token block of a prompt is named by a hash chained over the prompt's blocks:

    h0 = H(seed, tokens[0:16])      seed: what else changes the KV (model, dtype, layers)
    h1 = H(h0,   tokens[16:32])     so a block's hash names its whole prefix: two prompts
    h2 = H(h1,   tokens[32:48])     that differ in any earlier token share no block

Only prompt blocks are named (computed once, when the request is added); decode blocks
and the last partial block are never shared. A named block's pages (one KV page per
attention layer) are in one of three states:

    held         ref_count > 0: owned by PREFIX_OWNER in the allocator, read by
                 ref_count requests (each holds it as one of its leading blocks)
    pending      ref_count 0, its last reader may still run (memory/reclaim.py)
    cached-free  ref_count 0, a cached group in the allocator (memory/allocator.py): a
                 hit takes it back; allocation drops the least recently used one, and
                 `on_drop` removes it from the index

A request lets go of its shared blocks tail first, so a chain is dropped from its end and
what stays cached is a prefix a later request can still reach.

A request's shared blocks are always its first `num_shared_blocks` blocks: a hit gives
the longest chain of held or cached-free blocks, and registration goes on from there in
order and stops at the first block whose hash is already named (another request computed
the same block at the same time: this copy stays private, as in vLLM).
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np

from rimuru.dataplane.engine.sched.request import Request
from rimuru.dataplane.memory.allocator import CACHED, PageAllocator
from rimuru.dataplane.memory.geometry import PageType
from rimuru.dataplane.memory.reclaim import DeferredReclaim

BlockHash = bytes
PREFIX_OWNER = ("prefix cache",)  # the allocator's owner of held shared blocks


def chain_seed(*parts: object) -> BlockHash:
    """The chain's root: everything besides the tokens that changes a block's KV."""
    return hashlib.sha256(repr(parts).encode()).digest()


def block_hashes(seed: BlockHash, token_ids: Sequence[int], block_size: int) -> list[BlockHash]:
    """The hash of every full block of `token_ids`, each chained on the one before."""
    tokens = np.asarray(token_ids, dtype=np.int64)
    hashes, parent = [], seed
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = hashlib.sha256(parent + tokens[start : start + block_size].tobytes()).digest()
        hashes.append(parent)
    return hashes


@dataclass
class SharedBlock:
    block_hash: BlockHash
    pages: tuple[int, ...]  # [L] one KV page per attention layer
    ref_count: int
    last_step: int  # the latest step a holder released it after


@dataclass(frozen=True)
class PrefixHit:
    """The cached blocks a request starts from (none: an empty hit)."""

    blocks: tuple[SharedBlock, ...] = ()
    block_size: int = 16

    @property
    def num_tokens(self) -> int:
        return len(self.blocks) * self.block_size

    @property
    def num_cached_free_pages(self) -> int:
        """Pages of the hit that are cached-free now: taking them leaves fewer to drop."""
        return sum(len(b.pages) for b in self.blocks if b.ref_count == 0)


NO_HIT = PrefixHit()


class PrefixCache:
    def __init__(self, allocator: PageAllocator, reclaim: DeferredReclaim, block_size: int):
        self.allocator = allocator
        self.reclaim = reclaim
        self.block_size = block_size
        self.index: dict[BlockHash, SharedBlock] = {}
        allocator.on_drop = self._dropped
        # vLLM's prefix-cache counters, in tokens: looked up at admission, and found
        self.num_queried_tokens = 0
        self.num_hit_tokens = 0

    def lookup(self, request: Request) -> PrefixHit:
        """The longest chain of named blocks that are held or cached-free, leaving at
        least the request's last token to compute (its logits are needed)."""
        max_blocks = (request.num_tokens - 1) // self.block_size
        blocks = []
        for h in request.block_hashes[:max_blocks]:
            block = self.index.get(h)
            if block is None or not (block.ref_count or self.allocator.is_cached(h)):
                break
            blocks.append(block)
        return PrefixHit(tuple(blocks), self.block_size) if blocks else NO_HIT

    def take(self, hit: PrefixHit, num_queried_tokens: int) -> None:
        """A request is admitted with `hit` (maybe empty): hold its blocks (cached-free
        ones leave the allocator's cache) and count the query."""
        for block in hit.blocks:
            if block.ref_count == 0:
                self.allocator.uncache(block.block_hash, PREFIX_OWNER)
            block.ref_count += 1
        self.num_queried_tokens += num_queried_tokens
        self.num_hit_tokens += hit.num_tokens

    def register(self, block_hash: BlockHash, pages: Sequence[int], owner: object) -> bool:
        """A request's block just computed becomes shared, held by it; False (nothing
        changed) if the hash is named already."""
        if block_hash in self.index:
            return False
        self.allocator.transfer(PageType.KV, pages, owner, PREFIX_OWNER)
        self.index[block_hash] = SharedBlock(block_hash, tuple(pages), 1, -1)
        return True

    def release(self, block_hash: BlockHash, last_step: int) -> None:
        """A holder lets go after `last_step`; the last one leaves it cached-free."""
        block = self.index[block_hash]
        block.ref_count -= 1
        block.last_step = max(block.last_step, last_step)
        if block.ref_count == 0:
            self.reclaim.release(
                PageType.KV, block.pages, PREFIX_OWNER, block.last_step, cache_key=block_hash
            )

    def _dropped(self, block_hash: object) -> None:
        del self.index[block_hash]

    @property
    def num_held_pages(self) -> int:
        return sum(len(b.pages) for b in self.index.values() if b.ref_count)

    def check_invariants(self, requests: Collection[Request]) -> None:
        """Each block's ref_count is the number of live requests holding it (by hash and
        pages); held blocks' pages are PREFIX_OWNER's, the others cached-free or pending;
        PREFIX_OWNER holds no other page. Raises AssertionError."""
        holders: dict[BlockHash, int] = {}
        for r in requests:
            if r.status.finished:
                continue
            table = r.block_table.array()
            for i in range(r.num_shared_blocks):
                h = r.block_hashes[i]
                block = self.index.get(h)
                if block is None or tuple(table[i].tolist()) != block.pages:
                    raise AssertionError(f"{r.request_id}'s block {i} is not the shared one")
                holders[h] = holders.get(h, 0) + 1
        owned = set()
        for h, block in self.index.items():
            if block.ref_count != holders.get(h, 0):
                raise AssertionError(
                    f"block {h.hex()[:8]}: ref_count {block.ref_count}, "
                    f"{holders.get(h, 0)} requests hold it"
                )
            owners = {self.allocator.owner_of(PageType.KV, p) for p in block.pages}
            if block.ref_count:
                if owners != {PREFIX_OWNER}:
                    raise AssertionError(f"held block {h.hex()[:8]} owned by {owners}")
                owned |= set(block.pages)
            elif not (
                (owners == {CACHED} and self.allocator.is_cached(h)) or self.reclaim.is_pending(h)
            ):
                raise AssertionError(f"free block {h.hex()[:8]} neither cached nor pending")
        prefix_pages = {
            p for t, p, o in self.allocator.owned_pages() if t is PageType.KV and o == PREFIX_OWNER
        }
        if prefix_pages != owned:
            raise AssertionError("pages held for the prefix cache outside any held block")
