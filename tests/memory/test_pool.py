import pytest
import torch

from rimuru.dataplane.memory.allocator import PageAllocator
from rimuru.dataplane.memory.geometry import PageGeometry, PageType
from rimuru.dataplane.memory.pool import UnifiedPool


def test_views_share_bytes_without_copies(geometry):
    pool = UnifiedPool(geometry, num_huge_pages=3, dtype=torch.float32)
    experts, kv = pool.view(PageType.EXPERT), pool.view(PageType.KV)
    assert experts.shape == (3, 16 * 16)
    assert kv.shape == (12, 2, 16, 1, 2)
    assert experts.data_ptr() == kv.data_ptr() == pool.buffer.data_ptr()
    # write expert page 1 through the expert view, read it back as KV pages 4..7
    values = torch.arange(256, dtype=torch.float32)
    experts[1].copy_(values)
    assert torch.equal(kv[4:8].reshape(-1), values)
    # and a KV write lands in the expert page's bytes
    kv[6, 1, 3, 0, 1] = -7.0
    assert experts[1][2 * 64 + 1 * 32 + 3 * 2 + 1].item() == -7.0
    # raw bytes agree too
    assert pool.buffer[1024:1028].view(torch.float32).item() == 0.0


def test_budget_too_small_names_sizes(geometry):
    with pytest.raises(ValueError, match="cannot hold one huge page of 1024 B"):
        UnifiedPool.from_budget(geometry, 1000, torch.float32)
    with pytest.raises(ValueError, match="at least one huge page"):
        PageAllocator(geometry, 0)


def test_dtype_must_match_geometry(geometry):
    with pytest.raises(ValueError, match="2 B per element"):
        UnifiedPool(geometry, 1, torch.float16)


def test_from_budget_rounds_down(geometry):
    pool = UnifiedPool.from_budget(geometry, 5000, torch.float32)
    assert pool.num_huge_pages == 4
    assert pool.num_pages(PageType.KV) == 16


def test_ssm_and_conv_views_cover_the_pool():
    from rimuru.dataplane.memory.geometry import MemoryShape

    g = PageGeometry.from_shape(
        MemoryShape(2, 4, 16, 16, 1, 2, 4, ssm_state_bytes=768, conv_state_bytes=128)
    )
    pool = UnifiedPool(g, 2, torch.float32)
    assert pool.view(PageType.SSM).shape == (8, 768)
    assert pool.view(PageType.CONV).shape == (48, 128)
    pool.view(PageType.SSM)[1, :4] = torch.tensor([1, 2, 3, 4], dtype=torch.uint8)
    assert pool.buffer[768:772].tolist() == [1, 2, 3, 4]


def test_padded_kv_pages_start_at_slot_offsets_and_never_touch_their_padding():
    """3 KV heads x head_dim 2 in fp32: 768 B of KV in a 1024 B slot, 2 per 2048 B expert
    page. The KV view's page stride is the slot; writing every element of every KV page
    leaves the last 256 B of each slot as they were."""
    from rimuru.dataplane.memory.geometry import MemoryShape

    g = PageGeometry.from_shape(MemoryShape(2, 4, 16, 32, 3, 2, 4))
    assert (g.content_bytes_of(PageType.KV), g.kv_page_bytes, g.ratio(PageType.KV)) == (
        768,
        1024,
        2,
    )
    pool = UnifiedPool(g, 2, torch.float32)
    pool.buffer.fill_(0xAB)
    kv = pool.view(PageType.KV)
    assert kv.shape == (4, 2, 16, 3, 2) and kv.stride() == (256, 96, 6, 2, 1)
    kv.copy_(torch.arange(4 * 192, dtype=torch.float32).view(4, 2, 16, 3, 2))
    slots = pool.buffer.view(4, 1024)
    for page in range(4):
        content = slots[page, :768].view(torch.float32)
        assert torch.equal(content, torch.arange(page * 192, (page + 1) * 192, dtype=torch.float32))
        assert bool((slots[page, 768:] == 0xAB).all())
    # expert page 1 is KV pages 2 and 3, padding included
    assert pool.view(PageType.EXPERT)[1].view(torch.uint8).data_ptr() == slots[2].data_ptr()


def test_padded_conv_view_exposes_each_slot_content():
    from rimuru.dataplane.memory.geometry import MemoryShape

    g = PageGeometry.from_shape(MemoryShape(2, 4, 16, 16, 1, 2, 4, conv_state_bytes=96))
    assert g.bytes_of(PageType.CONV) == 128  # 96 B padded to the next divisor of 1024 B
    conv = UnifiedPool(g, 1, torch.float32).view(PageType.CONV)
    assert conv.shape == (8, 96) and conv.stride() == (128, 1)
