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
    pool.expert_matrix(1, 16, 16).copy_(values.view(16, 16))
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
