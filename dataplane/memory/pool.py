"""The unified pool: one contiguous uint8 tensor and typed views of its bytes.

Nothing of the KV cache or of resident expert weights lives outside this tensor. Each
page type sees the same bytes through its own view, made with `.view(dtype).view(shape)`
(no copies), indexed by that type's page id:

    bytes   [ huge 0                          | huge 1                          | ...
    expert  [ e0        | e1        | e2      | e3 ...                  (I*D elems each)
    kv      [ k0|k1|k2|...                                     ([2, 16, H_kv, Dh] each)

A page id times its slot size is its byte offset, so expert page 5 and KV pages
5*r .. 5*r+r-1 (r = KV pages per expert page) are the same bytes. The allocator makes
sure no two live users ever hold overlapping pages.

A padded page type (its content smaller than its slot, see geometry.py) is viewed as
[P, slot] sliced to [P, content]: page p still starts at p * slot, the view's page stride
is the slot and its padding is never addressed. Every consumer of the KV view indexes
pages through stride(0) (the Triton kernels take it as `stride_page`), never through a
page size of its own.
"""

from __future__ import annotations

import torch

from rimuru.dataplane.memory.geometry import PageGeometry, PageType


class UnifiedPool:
    def __init__(
        self,
        geometry: PageGeometry,
        num_huge_pages: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
        expert_dtype: torch.dtype | None = None,
    ):
        """dtype: the activations' (KV pages); expert_dtype: the experts' (block FP8's
        float8_e4m3fn), None = dtype."""
        if num_huge_pages < 1:
            raise ValueError(
                f"the pool must hold at least one huge page of {geometry.huge_page_bytes} B"
            )
        itemsize = torch.empty((), dtype=dtype).element_size()
        if itemsize != geometry.shape.dtype_bytes:
            raise ValueError(
                f"dtype {dtype} has {itemsize} B per element but the geometry was computed "
                f"for {geometry.shape.dtype_bytes} B"
            )
        expert_dtype = dtype if expert_dtype is None else expert_dtype
        if expert_dtype.itemsize != geometry.shape.expert_itemsize:
            raise ValueError(
                f"expert dtype {expert_dtype} has {expert_dtype.itemsize} B per element but the "
                f"geometry's expert pages hold {geometry.shape.expert_itemsize} B per element"
            )
        self.geometry = geometry
        self.dtype = dtype
        self.expert_dtype = expert_dtype
        self.num_huge_pages = num_huge_pages
        self.num_bytes = num_huge_pages * geometry.huge_page_bytes
        self.device = torch.device(device)
        self.buffer = torch.empty(self.num_bytes, dtype=torch.uint8, device=self.device)
        self._views: dict[PageType, torch.Tensor] = {}

    @classmethod
    def from_budget(
        cls,
        geometry: PageGeometry,
        budget_bytes: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
        expert_dtype: torch.dtype | None = None,
    ) -> UnifiedPool:
        num_huge = budget_bytes // geometry.huge_page_bytes
        if num_huge < 1:
            raise ValueError(
                f"a pool budget of {budget_bytes} B cannot hold one huge page of "
                f"{geometry.huge_page_bytes} B: raise --memory-budget"
            )
        return cls(geometry, num_huge, dtype, device, expert_dtype)

    def num_pages(self, page_type: PageType) -> int:
        return self.num_bytes // self.geometry.bytes_of(page_type)

    def view(self, page_type: PageType) -> torch.Tensor:
        """The whole pool seen as pages of `page_type` (a view: writes go to the pool)."""
        if page_type not in self._views:
            self._views[page_type] = self._make_view(page_type)
        return self._views[page_type]

    def _make_view(self, page_type: PageType) -> torch.Tensor:
        shape = self.geometry.shape
        n = self.num_pages(page_type)
        slot, content = self.geometry.bytes_of(page_type), self.geometry.content_bytes_of(page_type)
        if page_type is PageType.KV:
            # [P, 2, block, H_kv, Dh]: K then V of one layer's 16-token block; page stride =
            # slot elements, which exceeds the block's elements when the KV page is padded
            itemsize = shape.dtype_bytes
            slots = self.buffer.view(self.dtype).view(n, slot // itemsize)
            block = slots[:, : content // itemsize]
            return block.view(n, 2, shape.block_size, shape.num_kv_heads, shape.head_dim)
        if page_type is PageType.EXPERT:
            # [P, I*D]: one expert matrix per page; w1/w3 read it as [I, D], w2 as [D, I]
            return self.buffer.view(self.expert_dtype).view(
                n, shape.moe_intermediate_size * shape.hidden_size
            )
        if page_type in (PageType.SSM, PageType.CONV, PageType.HUGE):
            return self.buffer.view(n, slot)[:, :content]  # raw bytes of each page's content
        raise ValueError(f"no view for page type {page_type!r}")
