"""The tuned block-config table: it parses, its tiles are launchable, lookups pick the nearest bucket."""

import pytest
import torch

from rimuru.kernels.moe_configs import (
    CONFIG_DIR,
    GemmTile,
    MoeConfig,
    default_moe_config,
    get_moe_config,
    load_table,
    nearest_bucket,
    shape_key,
)

TABLES = sorted(p.name for p in CONFIG_DIR.glob("fused_moe_*.json"))


def _power_of_two(n: int) -> bool:
    return n >= 16 and n & (n - 1) == 0


def test_a_table_is_committed_for_the_h200():
    assert "fused_moe_NVIDIA_H200.json" in TABLES


@pytest.mark.parametrize("name", TABLES)
def test_every_entry_is_a_valid_config(name):
    table = load_table(name)
    assert table, f"{name} holds no shapes"
    for key, buckets in table.items():
        assert key.startswith("E=") and ",dtype=" in key
        assert sorted(buckets) == [2**i for i in range(13)], key
        for config in buckets.values():
            assert _power_of_two(config.block_m)
            for tile in (config.gemm1, config.gemm2):
                assert _power_of_two(tile.block_n) and _power_of_two(tile.block_k)
                assert tile.num_warps in (2, 4, 8) and 1 <= tile.num_stages <= 6
                assert tile.tail in (0, 1, 2) and config.block_m >> tile.tail >= 16


@pytest.mark.parametrize(
    ("block_m", "tail", "match"),
    [(64, 3, "tail must be 0, 1 or 2"), (64, -1, "tail must be"), (32, 2, "below 16 rows")],
)
def test_a_tail_that_cannot_launch_is_refused(block_m, tail, match):
    with pytest.raises(ValueError, match=match):
        MoeConfig(block_m, GemmTile(64, 64), GemmTile(64, 64, tail=tail))


def test_an_unknown_schedule_is_refused():
    with pytest.raises(ValueError, match="schedule must be one of"):
        GemmTile(64, 64, schedule="warp_specialized")


def test_a_flag_that_is_not_a_bool_is_refused():
    with pytest.raises(ValueError, match="presort must be true or false"):
        GemmTile(64, 64, presort="false")


def test_presort_is_refused_on_the_down_gemm():
    with pytest.raises(ValueError, match="presort is for gemm1"):
        MoeConfig(64, GemmTile(64, 64), GemmTile(64, 64, presort=True))


def test_nearest_bucket_prefers_the_closest_token_count():
    a = MoeConfig(16, GemmTile(64, 64), GemmTile(64, 64))
    b = MoeConfig(64, GemmTile(128, 64), GemmTile(128, 64))
    buckets = {1: a, 64: b}
    assert nearest_bucket(buckets, 1) is a
    assert nearest_bucket(buckets, 32) is a  # |32-1| = 31 < 32: ties go to the smaller
    assert nearest_bucket(buckets, 33) is b
    assert nearest_bucket(buckets, 5000) is b


def test_cpu_lookup_uses_the_default():
    config = get_moe_config(60, 1408, 2048, 4096, 4, torch.float32, torch.device("cpu"))
    assert config == default_moe_config(4096, 4, 60)
    assert default_moe_config(1, 8, 128).block_m == 16
    assert default_moe_config(4096, 8, 128).block_m == 64


def test_shape_key_names_the_dtype_without_prefix():
    assert shape_key(60, 1408, 2048, torch.bfloat16) == "E=60,I=1408,D=2048,dtype=bfloat16"
