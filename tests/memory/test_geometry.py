from dataclasses import replace

import pytest

from rimuru.dataplane.memory.geometry import (
    MemoryShape,
    PageGeometry,
    PagePadding,
    PageType,
    padded_slot_bytes,
)


def qwen15_moe() -> MemoryShape:
    return MemoryShape(24, 60, 2048, 1408, num_kv_heads=16, head_dim=128, dtype_bytes=2)


def test_qwen15_per_layer_kv_page_divides_expert_page():
    g = PageGeometry.from_shape(qwen15_moe())
    assert g.expert_page_bytes == 1408 * 2048 * 2 == 5_767_168
    assert g.kv_page_bytes == 2 * 16 * 16 * 128 * 2 == 131_072
    assert g.kv_pages_per_expert_page == 44
    assert g.huge_page_bytes == g.expert_page_bytes
    # a 16-token page of all 24 layers would not divide the expert page
    assert g.expert_page_bytes % (24 * g.kv_page_bytes) != 0


@pytest.mark.parametrize(
    ("shape", "ratio"),
    [
        (MemoryShape(48, 128, 2048, 768, num_kv_heads=4, head_dim=128, dtype_bytes=2), 96),
        (MemoryShape(32, 8, 4096, 14336, num_kv_heads=8, head_dim=128, dtype_bytes=2), 1792),
    ],
    ids=["qwen3-30b-a3b", "mixtral-8x7b"],
)
def test_supported_models_fit(shape, ratio):
    assert PageGeometry.from_shape(shape).kv_pages_per_expert_page == ratio


def test_fp8_expert_pages_are_half_the_bf16_ones_and_keep_the_kv_tiling():
    bf16 = MemoryShape(48, 128, 2048, 768, num_kv_heads=4, head_dim=128, dtype_bytes=2)
    fp8 = PageGeometry.from_shape(replace(bf16, expert_dtype_bytes=1))
    assert fp8.expert_page_bytes == 768 * 2048 == 1_572_864
    assert PageGeometry.from_shape(bf16).expert_page_bytes == 2 * fp8.expert_page_bytes
    assert fp8.kv_page_bytes == 32_768 and fp8.kv_pages_per_expert_page == 48
    assert fp8.huge_page_bytes == fp8.expert_page_bytes
    assert all(p.waste_bytes == 0 for p in fp8.padding)
    with pytest.raises(ValueError, match="expert_dtype_bytes must be > 0"):
        PageGeometry.from_shape(replace(bf16, expert_dtype_bytes=0))


def test_ssm_makes_huge_page_the_lcm():
    shape = MemoryShape(2, 4, 16, 16, 1, 2, 4, ssm_state_bytes=768, conv_state_bytes=128)
    g = PageGeometry.from_shape(shape)
    assert g.huge_page_bytes == 3072  # lcm(1024, 768)
    assert g.ratio(PageType.EXPERT) == 3
    assert g.ratio(PageType.SSM) == 4
    assert g.ratio(PageType.CONV) == 8


def test_kv_page_that_does_not_divide_is_padded_to_the_next_divisor():
    """Refused before padding: 768 B of KV do not divide a 1024 B expert page."""
    g = PageGeometry.from_shape(
        MemoryShape(2, 4, 16, 16, num_kv_heads=3, head_dim=2, dtype_bytes=4)
    )
    assert g.content_bytes_of(PageType.KV) == 2 * 16 * 3 * 2 * 4 == 768
    assert g.kv_page_bytes == 1024 and g.kv_pages_per_expert_page == 1
    assert g.padding[1] == PagePadding(PageType.KV, 768, 1024)


def test_mixtral_like_model_with_six_kv_heads_gets_a_56_kib_kv_slot():
    """Mixtral-8x7B's experts with 6 KV heads: 48 KiB of KV (3 * 2^14) do not divide the
    7 * 2^24 B expert page; the smallest divisor above is 7 * 2^13 = 56 KiB, not 64 KiB."""
    shape = MemoryShape(32, 8, 4096, 14336, num_kv_heads=6, head_dim=128, dtype_bytes=2)
    g = PageGeometry.from_shape(shape)
    assert g.expert_page_bytes == 14336 * 4096 * 2 == 7 * 2**24
    assert g.content_bytes_of(PageType.KV) == 2 * 16 * 6 * 128 * 2 == 49_152
    assert g.kv_page_bytes == 57_344 and g.kv_pages_per_expert_page == 2048
    (kv,) = [p for p in g.padding if p.page_type is PageType.KV]
    assert kv.waste_bytes == 8192 and kv.waste_fraction == 1 / 7
    assert g.huge_page_bytes == g.expert_page_bytes


def test_refuses_kv_page_larger_than_expert_page_with_advice_a_user_can_follow():
    """block_size is fixed at 16, so the refusal must not advise another block size: it says
    the model cannot be served and which shapes can, in config.json's terms."""
    shape = MemoryShape(2, 4, 16, 16, num_kv_heads=3, head_dim=4, dtype_bytes=4)
    with pytest.raises(ValueError) as err:
        PageGeometry.from_shape(shape)
    message = str(err.value)
    assert message.startswith("this model cannot be served by this version of rimuru")
    assert "(2 x 16 tokens x 3 KV heads x head_dim 4 = 384 elements of 4 B) is larger" in message
    assert "(moe_intermediate_size 16 x hidden_size 16 = 256 elements of 4 B)" in message
    assert "the block size is fixed at 16 tokens" in message
    assert "is at least 2 x 16 x num_key_value_heads x head_dim x the KV cache's" in message
    assert "block size may fit" not in message
    # FP8 experts: the same elements in half the bytes of a bf16 KV cache's
    fits = MemoryShape(2, 4, 32, 12, num_kv_heads=3, head_dim=4, dtype_bytes=2)
    assert PageGeometry.from_shape(fits).expert_page_bytes == 768
    with pytest.raises(ValueError, match=r"= 384 elements of 1 B\)"):
        PageGeometry.from_shape(replace(fits, expert_dtype_bytes=1))


def test_refuses_conv_state_larger_than_expert_page():
    with pytest.raises(ValueError, match="conv state of 1028 B is larger than the expert page"):
        PageGeometry.from_shape(MemoryShape(2, 4, 16, 16, 1, 2, 4, conv_state_bytes=1028))


@pytest.mark.parametrize(
    ("content", "parent", "align", "slot"),
    [
        (256, 1024, 4, 256),  # divides: no padding
        (768, 1024, 4, 1024),
        (160, 768, 4, 192),  # 768 = 3 * 2^8: 192 divides it, 256 would too but is larger
        (4, 30, 2, 6),  # 5 B divides 30 B but is not a whole 2 B element
        (30, 30, 2, 30),
        (31, 30, 2, None),  # larger than the parent
    ],
)
def test_padded_slot_is_the_smallest_aligned_divisor(content, parent, align, slot):
    assert padded_slot_bytes(content, parent, align) == slot


def test_refuses_bad_sizes():
    with pytest.raises(ValueError, match="hidden_size must be > 0"):
        PageGeometry.from_shape(MemoryShape(2, 4, 0, 16, 1, 2, 4))
