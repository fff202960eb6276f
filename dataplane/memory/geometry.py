"""Page geometry: the sizes of every page type, computed once from a model's shapes.

Three tiers; each page type is carved from its parent, so every page's slot must divide
its parent's slot:

    huge page  = lcm(expert slot, SSM slot)         (= the expert page without SSM layers)
    ├── expert page  one expert matrix (w1, w3 or w2 of one expert): I * D elements
    │                (block FP8: I * D bytes; the block scales stay outside the pool)
    │   ├── KV page    one attention layer's 16-token block: [2, 16, H_kv, Dh]
    │   └── conv page  one GDN layer's conv state of one request: [conv_dim, kernel - 1]
    └── SSM page     one GDN layer's recurrent state of one request: fp32 [H_v, D_k, D_v]

    one slot of a padded page type:
    [ content (what the view exposes) | padding (never read or written) ]
    |<------------------------ slot ------------------------------------>|

Why every slot must divide its parent: the allocator numbers a type's pages in that
type's unit across the whole pool, so page p of slot size S covers bytes [p*S, (p+1)*S)
and its parent is page p // (parent slot // S). That only works when a whole number of
children tiles each parent exactly: no child straddles two parents, and freeing every
child of a parent gives back exactly that parent's bytes to merge upward. So a KV or conv
page whose content does not divide the expert page is padded to the smallest size that
does (and is a whole number of elements, so the typed views can address it); the padding
is the price of the tiling, and `PageGeometry.padding` reports it. The smallest such
divisor wastes the least per page: Qwen3.5's conv state of 48 KiB sits in a 64 KiB slot
(32 per 2 MiB expert page), a Mixtral-like model with 6 KV heads has 48 KiB of KV in a
56 KiB slot (2048 per 7 * 16 MiB expert page). SSM pages need no padding: the huge page
is defined as the lcm of the two middle-tier slots, so both divide it.

A KV page is per layer, not one block of all layers: for Qwen1.5-MoE-A2.7B a 16-token
block of all 24 layers (3 MiB) does not divide an expert page (5.5 MiB), a per-layer
block (128 KiB) does — 44 of them fill one expert page. Carving KV pages from expert pages
rather than from huge pages keeps them small beside SSM pages.

A block-FP8 expert page holds its matrix's e4m3 bytes only (half a BF16 page); its fp32
scales (one per 128 x 128 block, 384 B beside Qwen3-30B-A3B's 1.5 MiB page: 0.02 %) stay
outside the pool, all layers' and experts' together, read by (layer, expert) as vLLM's fused
MoE reads its `w1_scale[E]`. Inside the page they would break the tiling: 1.5 MiB + 384 B is
divided by no KV page, so every KV slot would be padded and the huge page's lcm with an SSM
page would grow past any pool. A side table indexed by page id would follow every page move
with a second copy; scales of every expert (48 x 128 x 3 x 384 B = 6.75 MiB for Qwen3-30B-A3B)
resident outside the pool need no copy at all, and are counted with the non-pool weights.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

BLOCK_SIZE = 16  # tokens per KV page, as in vLLM
SSM_STATE_DTYPE_BYTES = 4  # the recurrent state is kept in fp32 whatever the weights' dtype


class PageType(enum.Enum):
    # Members are singletons compared by identity: hash them the fast (C) way, since page
    # types key every dict of the allocator's hot path.
    __hash__ = object.__hash__

    HUGE = "huge"
    EXPERT = "expert"
    KV = "kv"
    SSM = "ssm"
    CONV = "conv"


# Which page type each type is carved from. HUGE is the root.
PARENT: dict[PageType, PageType] = {
    PageType.EXPERT: PageType.HUGE,
    PageType.SSM: PageType.HUGE,
    PageType.KV: PageType.EXPERT,
    PageType.CONV: PageType.EXPERT,
}


@dataclass(frozen=True)
class GatedDeltaNetShape:
    """One Gated DeltaNet layer's per-request state, in config.json's terms (linear_*)."""

    num_key_heads: int  # H_k
    num_value_heads: int  # H_v
    key_head_dim: int  # D_k
    value_head_dim: int  # D_v
    conv_kernel_size: int

    @property
    def conv_dim(self) -> int:
        # the short convolution runs over q, k and v together
        return (
            2 * self.num_key_heads * self.key_head_dim + self.num_value_heads * self.value_head_dim
        )

    @property
    def ssm_state_bytes(self) -> int:
        # fp32 [H_v, D_k, D_v]
        return (
            self.num_value_heads * self.key_head_dim * self.value_head_dim * SSM_STATE_DTYPE_BYTES
        )

    def conv_state_bytes(self, dtype_bytes: int) -> int:
        # [conv_dim, kernel - 1] in the weights' dtype: the last kernel - 1 inputs
        return self.conv_dim * (self.conv_kernel_size - 1) * dtype_bytes


@dataclass(frozen=True)
class MemoryShape:
    """What the pool must know about a model (derived from its config)."""

    num_layers: int
    num_experts: int
    hidden_size: int
    moe_intermediate_size: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int
    block_size: int = BLOCK_SIZE
    # one GDN layer's state of one request (GatedDeltaNetShape computes them); 0 = none
    ssm_state_bytes: int = 0
    conv_state_bytes: int = 0
    # bytes per expert weight when experts are stored apart from the activations' dtype
    # (block FP8: 1, its scales kept outside the pool); None = dtype_bytes
    expert_dtype_bytes: int | None = None

    @property
    def expert_itemsize(self) -> int:
        return self.dtype_bytes if self.expert_dtype_bytes is None else self.expert_dtype_bytes

    @property
    def expert_page_bytes(self) -> int:
        return self.moe_intermediate_size * self.hidden_size * self.expert_itemsize

    @property
    def kv_page_bytes(self) -> int:
        """A KV page's content; its slot may be larger (see `PageGeometry.padding`)."""
        return 2 * self.block_size * self.num_kv_heads * self.head_dim * self.dtype_bytes


@dataclass(frozen=True)
class PagePadding:
    """One page type's slot against its content: what the memory plan reports."""

    page_type: PageType
    content_bytes: int
    slot_bytes: int

    @property
    def waste_bytes(self) -> int:
        return self.slot_bytes - self.content_bytes

    @property
    def waste_fraction(self) -> float:
        return self.waste_bytes / self.slot_bytes

    def describe(self) -> str:
        text = f"{self.page_type.value} page {self.content_bytes} B"
        if self.waste_bytes:
            text += (
                f" in a {self.slot_bytes} B slot ({self.waste_bytes} B padding, "
                f"{100 * self.waste_fraction:.1f}%)"
            )
        return text


def padded_slot_bytes(content_bytes: int, parent_bytes: int, align_bytes: int) -> int | None:
    """The smallest multiple of `align_bytes` that is >= `content_bytes` and divides
    `parent_bytes`; None if the content is larger than the parent. `parent_bytes` must be a
    multiple of `align_bytes`."""
    if content_bytes > parent_bytes:
        return None
    units = parent_bytes // align_bytes  # slots are align * d for the divisors d of units
    need = -(-content_bytes // align_bytes)
    best = units
    for d in range(1, math.isqrt(units) + 1):
        if units % d == 0:
            for divisor in (d, units // d):
                if need <= divisor < best:
                    best = divisor
    return best * align_bytes


def _kv_larger_than_expert(shape: MemoryShape) -> str:
    """Why a model whose KV page is larger than its expert page cannot be served, in terms
    a user can check against a config.json (bytes per element named: FP8 experts hold one
    byte, the KV cache the activations' dtype)."""
    kv_elems = 2 * shape.block_size * shape.num_kv_heads * shape.head_dim
    expert_elems = shape.moe_intermediate_size * shape.hidden_size
    return (
        f"this model cannot be served by this version of rimuru: its KV page (2 x "
        f"{shape.block_size} tokens x {shape.num_kv_heads} KV heads x head_dim "
        f"{shape.head_dim} = {kv_elems} elements of {shape.dtype_bytes} B) is larger than "
        f"its expert page (moe_intermediate_size {shape.moe_intermediate_size} x hidden_size "
        f"{shape.hidden_size} = {expert_elems} elements of {shape.expert_itemsize} B). KV "
        f"pages are carved from expert pages and the block size is fixed at {BLOCK_SIZE} "
        f"tokens, so only models whose moe_intermediate_size x hidden_size x the experts' "
        f"bytes per element is at least 2 x {BLOCK_SIZE} x num_key_value_heads x head_dim x "
        f"the KV cache's can be served (every supported preset is one)"
    )


@dataclass(frozen=True)
class PageGeometry:
    """Slot and content sizes in bytes of every page type. Computed once.

    `page_bytes` are the slots: what the allocator tiles and a page id is multiplied by.
    `content_bytes` are what the pool's views expose of each slot."""

    shape: MemoryShape
    page_bytes: dict[PageType, int]
    content_bytes: dict[PageType, int]

    @classmethod
    def from_shape(cls, shape: MemoryShape) -> PageGeometry:
        for name in ("num_layers", "num_experts", "hidden_size", "moe_intermediate_size"):
            if getattr(shape, name) <= 0:
                raise ValueError(f"MemoryShape.{name} must be > 0, got {getattr(shape, name)}")
        for name in ("num_kv_heads", "head_dim", "dtype_bytes", "block_size"):
            if getattr(shape, name) <= 0:
                raise ValueError(f"MemoryShape.{name} must be > 0, got {getattr(shape, name)}")
        if shape.expert_dtype_bytes is not None and shape.expert_dtype_bytes <= 0:
            raise ValueError("MemoryShape.expert_dtype_bytes must be > 0 or None")
        for name in ("ssm_state_bytes", "conv_state_bytes"):
            if getattr(shape, name) < 0:
                raise ValueError(f"MemoryShape.{name} must be >= 0, got {getattr(shape, name)}")
        expert = shape.expert_page_bytes
        content = {PageType.EXPERT: expert, PageType.KV: shape.kv_page_bytes}
        if shape.ssm_state_bytes > 0:
            content[PageType.SSM] = shape.ssm_state_bytes
        if shape.conv_state_bytes > 0:
            content[PageType.CONV] = shape.conv_state_bytes
        slots = {PageType.EXPERT: expert}
        if PageType.SSM in content:
            slots[PageType.SSM] = content[PageType.SSM]
        # KV and conv pages are read through views of the weights' dtype: whole elements
        for small in (PageType.KV, PageType.CONV):
            if small in content:
                slot = padded_slot_bytes(content[small], expert, shape.dtype_bytes)
                if slot is None and small is PageType.KV:
                    raise ValueError(_kv_larger_than_expert(shape))
                if slot is None:
                    raise ValueError(
                        f"the conv state of {content[small]} B is larger than the expert page "
                        f"of {expert} B: conv pages are carved from expert pages, so this "
                        f"version cannot serve this model"
                    )
                slots[small] = slot
        huge = math.lcm(expert, slots.get(PageType.SSM, expert))
        slots[PageType.HUGE] = content[PageType.HUGE] = huge
        return cls(shape=shape, page_bytes=slots, content_bytes=content)

    def has(self, page_type: PageType) -> bool:
        return page_type in self.page_bytes

    def bytes_of(self, page_type: PageType) -> int:
        """The slot size: the stride between consecutive pages of this type."""
        if page_type not in self.page_bytes:
            raise ValueError(f"this model has no {page_type.value} pages")
        return self.page_bytes[page_type]

    def content_bytes_of(self, page_type: PageType) -> int:
        self.bytes_of(page_type)  # same refusal for a type this model lacks
        return self.content_bytes[page_type]

    def ratio(self, child: PageType) -> int:
        """How many `child` pages one page of its parent type splits into."""
        return self.bytes_of(PARENT[child]) // self.bytes_of(child)

    @property
    def padding(self) -> tuple[PagePadding, ...]:
        """Slot against content of every page type but the huge page, in tier order."""
        return tuple(
            PagePadding(t, self.content_bytes[t], self.page_bytes[t])
            for t in PARENT
            if t in self.page_bytes
        )

    @property
    def huge_page_bytes(self) -> int:
        return self.page_bytes[PageType.HUGE]

    @property
    def expert_page_bytes(self) -> int:
        return self.page_bytes[PageType.EXPERT]

    @property
    def kv_page_bytes(self) -> int:
        return self.page_bytes[PageType.KV]

    @property
    def kv_pages_per_expert_page(self) -> int:
        return self.ratio(PageType.KV)

    def state_bytes(self, num_state_layers: int) -> int:
        """A hybrid request's state pages: one SSM and one conv slot per GDN layer."""
        if not num_state_layers:
            return 0
        return num_state_layers * (self.bytes_of(PageType.SSM) + self.bytes_of(PageType.CONV))

    def state_parent_bytes(self, num_state_layers: int, num_requests: int = 1) -> int:
        """The pool bytes `num_requests` hybrid requests' state pages take when nothing else
        shares their parents: a parent page cut into SSM (or conv) pages holds no other
        type, so each type costs whole parents (SSM pages in huge pages, conv pages in
        expert pages). What one request running alone needs beside its KV pages;
        `state_bytes` (the slots alone) is less unless the pages fill their parents."""
        if not num_state_layers:
            return 0
        pages = num_state_layers * num_requests
        return sum(
            -(-pages // self.ratio(t)) * self.bytes_of(PARENT[t])
            for t in (PageType.SSM, PageType.CONV)
        )

    def describe(self) -> str:
        pages = ", ".join(p.describe() for p in self.padding)
        return f"page geometry: huge page {self.huge_page_bytes} B; {pages}"
