"""Page geometry: the sizes of every page type, computed once from a model's shapes.

    huge page   = lcm(expert page, SSM page)      (= expert page without SSM layers)
    ├── expert page  = one expert matrix (w1, w3 or w2 of one expert): I * D elements
    │   ├── KV page      = one layer's 16-token block: [2, 16, H_kv, Dh]
    │   └── conv page    = one layer's conv state (hybrid models)
    └── SSM page     = one layer's SSM state (hybrid models)

A KV page is per layer, not one block of all layers: for Qwen1.5-MoE-A2.7B a 16-token
block of all 24 layers (3 MiB) does not divide an expert page (5.5 MiB), a per-layer
block (128 KiB) does — 44 of them fill one expert page. The same holds for every
supported model, which is why KV pages are carved from expert pages, never from huge
pages directly.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

BLOCK_SIZE = 16  # tokens per KV page, as in vLLM


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
    ssm_state_bytes: int = 0  # one layer's SSM state of one request; 0 = no SSM layers
    conv_state_bytes: int = 0  # one layer's conv state of one request; 0 = none

    @property
    def expert_page_bytes(self) -> int:
        return self.moe_intermediate_size * self.hidden_size * self.dtype_bytes

    @property
    def kv_page_bytes(self) -> int:
        return 2 * self.block_size * self.num_kv_heads * self.head_dim * self.dtype_bytes


def _kv_does_not_divide(shape: MemoryShape) -> str:
    """Why a model whose KV page does not divide its expert page cannot be served, in terms a
    user can check against a config.json (the dtype's bytes cancel out)."""
    kv_elems = 2 * shape.block_size * shape.num_kv_heads * shape.head_dim
    expert_elems = shape.moe_intermediate_size * shape.hidden_size
    return (
        f"this model cannot be served by this version of rimuru: its KV page (2 x "
        f"{shape.block_size} tokens x {shape.num_kv_heads} KV heads x head_dim "
        f"{shape.head_dim} = {kv_elems} elements) does not divide its expert page "
        f"(moe_intermediate_size {shape.moe_intermediate_size} x hidden_size "
        f"{shape.hidden_size} = {expert_elems} elements). KV pages are carved from expert "
        f"pages and the block size is fixed at {BLOCK_SIZE} tokens, so only models whose "
        f"moe_intermediate_size x hidden_size is a multiple of 2 x {BLOCK_SIZE} x "
        f"num_key_value_heads x head_dim can be served (every supported preset is one)"
    )


@dataclass(frozen=True)
class PageGeometry:
    """Page sizes in bytes and the split ratios between levels. Computed once."""

    shape: MemoryShape
    page_bytes: dict[PageType, int]

    @classmethod
    def from_shape(cls, shape: MemoryShape) -> PageGeometry:
        for name in ("num_layers", "num_experts", "hidden_size", "moe_intermediate_size"):
            if getattr(shape, name) <= 0:
                raise ValueError(f"MemoryShape.{name} must be > 0, got {getattr(shape, name)}")
        for name in ("num_kv_heads", "head_dim", "dtype_bytes", "block_size"):
            if getattr(shape, name) <= 0:
                raise ValueError(f"MemoryShape.{name} must be > 0, got {getattr(shape, name)}")
        expert = shape.expert_page_bytes
        kv = shape.kv_page_bytes
        sizes = {PageType.EXPERT: expert, PageType.KV: kv}
        huge = expert
        if shape.ssm_state_bytes > 0:
            sizes[PageType.SSM] = shape.ssm_state_bytes
            huge = math.lcm(expert, shape.ssm_state_bytes)
        if shape.conv_state_bytes > 0:
            sizes[PageType.CONV] = shape.conv_state_bytes
        sizes[PageType.HUGE] = huge
        if expert % kv != 0:
            raise ValueError(_kv_does_not_divide(shape))
        if PageType.CONV in sizes and expert % sizes[PageType.CONV] != 0:
            raise ValueError(
                f"the conv page of {sizes[PageType.CONV]} B does not divide the expert page of "
                f"{expert} B: conv pages are carved from expert pages, so this version cannot "
                f"serve this model"
            )
        return cls(shape=shape, page_bytes=sizes)

    def has(self, page_type: PageType) -> bool:
        return page_type in self.page_bytes

    def bytes_of(self, page_type: PageType) -> int:
        if page_type not in self.page_bytes:
            raise ValueError(f"this model has no {page_type.value} pages")
        return self.page_bytes[page_type]

    def ratio(self, child: PageType) -> int:
        """How many `child` pages one page of its parent type splits into."""
        return self.bytes_of(PARENT[child]) // self.bytes_of(child)

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

    def describe(self) -> str:
        parts = [f"{t.value}={b} B" for t, b in self.page_bytes.items()]
        return "page geometry: " + ", ".join(parts)
