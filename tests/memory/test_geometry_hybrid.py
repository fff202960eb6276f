"""Page geometry of the hybrid models (Gated DeltaNet + attention + MoE) at their real
shapes, from the published config.json values (bf16 weights)."""

import pytest

from rimuru.dataplane.memory.geometry import (
    GatedDeltaNetShape,
    MemoryShape,
    PageGeometry,
    PagePadding,
    PageType,
)

KiB, MiB = 2**10, 2**20
# linear_num_key_heads 16, linear_num_value_heads 32, linear_key/value_head_dim 128,
# linear_conv_kernel_dim 4: the same in Qwen3.5-35B-A3B and Qwen3-Next-80B-A3B
GDN = GatedDeltaNetShape(16, 32, 128, 128, 4)


def hybrid_shape(num_layers: int, num_experts: int) -> MemoryShape:
    # hidden 2048, moe_intermediate_size 512, 2 KV heads of head_dim 256
    return MemoryShape(
        num_layers,
        num_experts,
        2048,
        512,
        num_kv_heads=2,
        head_dim=256,
        dtype_bytes=2,
        ssm_state_bytes=GDN.ssm_state_bytes,
        conv_state_bytes=GDN.conv_state_bytes(2),
    )


def test_gated_deltanet_state_sizes():
    assert GDN.conv_dim == 2 * 16 * 128 + 32 * 128 == 8192
    assert GDN.ssm_state_bytes == 32 * 128 * 128 * 4 == 2 * MiB  # fp32 [H_v, D_k, D_v]
    assert GDN.conv_state_bytes(2) == 8192 * 3 * 2 == 48 * KiB  # bf16 [conv_dim, 3]


@pytest.mark.parametrize(
    ("num_layers", "num_experts"), [(40, 256), (48, 512)], ids=["qwen3.5-35b-a3b", "qwen3-next-80b"]
)
def test_hybrid_page_sizes_padding_and_lcm(num_layers, num_experts):
    g = PageGeometry.from_shape(hybrid_shape(num_layers, num_experts))
    assert g.expert_page_bytes == 512 * 2048 * 2 == 2 * MiB
    assert g.huge_page_bytes == 2 * MiB  # lcm(2 MiB expert, 2 MiB SSM)
    assert g.bytes_of(PageType.SSM) == 2 * MiB
    assert g.kv_page_bytes == 2 * 16 * 2 * 256 * 2 == 32 * KiB
    assert g.bytes_of(PageType.CONV) == 64 * KiB  # 48 KiB padded: 64 KiB divides 2 MiB
    assert g.content_bytes_of(PageType.CONV) == 48 * KiB
    ratios = {t: g.ratio(t) for t in (PageType.EXPERT, PageType.SSM, PageType.KV, PageType.CONV)}
    assert ratios == {PageType.EXPERT: 1, PageType.SSM: 1, PageType.KV: 64, PageType.CONV: 32}
    assert g.padding == (
        PagePadding(PageType.EXPERT, 2 * MiB, 2 * MiB),
        PagePadding(PageType.SSM, 2 * MiB, 2 * MiB),
        PagePadding(PageType.KV, 32 * KiB, 32 * KiB),
        PagePadding(PageType.CONV, 48 * KiB, 64 * KiB),
    )
    assert [p.waste_bytes for p in g.padding] == [0, 0, 0, 16 * KiB]
    assert g.describe() == (
        "page geometry: huge page 2097152 B; expert page 2097152 B, ssm page 2097152 B, "
        "kv page 32768 B, conv page 49152 B in a 65536 B slot (16384 B padding, 25.0%)"
    )


def test_ssm_page_unlike_the_expert_page_makes_the_huge_page_their_lcm():
    """A 3 MiB SSM state beside a 2 MiB expert page: huge = 6 MiB, 3 experts or 2 states."""
    shape = MemoryShape(4, 8, 2048, 512, 2, 256, 2, ssm_state_bytes=3 * MiB)
    g = PageGeometry.from_shape(shape)
    assert g.huge_page_bytes == 6 * MiB
    assert g.ratio(PageType.EXPERT) == 3 and g.ratio(PageType.SSM) == 2


def test_state_pages_cost_whole_parents_when_no_other_request_shares_them():
    """Qwen3.5-35B-A3B's 30 GDN layers: 30 SSM huge pages and 30 conv pages, which need one
    expert page of 32 (a parent cut into conv pages holds nothing else); two requests' 60
    conv pages need two."""
    g = PageGeometry.from_shape(hybrid_shape(40, 256))
    assert g.state_bytes(30) == 30 * (2 * MiB + 64 * KiB)
    assert g.state_parent_bytes(30) == 30 * 2 * MiB + 2 * MiB
    assert g.state_parent_bytes(30, num_requests=2) == 60 * 2 * MiB + 2 * 2 * MiB
    assert g.state_parent_bytes(0) == 0
