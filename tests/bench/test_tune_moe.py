"""bench/tune_moe.py's candidate lists and same-run ratios (pure functions, no GPU)."""

import sys
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from tune_moe import (
    GROUP_MS,
    group_m_variants,
    refine_group_m,
    tiles_for,
    variant_ratios,
)

from rimuru.kernels.moe_configs import GemmTile


def test_each_ratio_divides_by_its_own_baseline():
    times = {
        GemmTile(128, 64): 10.0,  # grid, gathered rows, no tail: the baseline
        GemmTile(128, 64, tail=2): 9.0,
        GemmTile(128, 64, schedule="persistent"): 11.0,
        GemmTile(128, 64, schedule="flattened"): 8.0,
        # Presorted candidates count for presort only, never for a schedule's ratio.
        GemmTile(128, 64, tma=True, presort=True): 7.0,
        GemmTile(128, 64, tma=True, presort=True, schedule="persistent"): 5.0,
    }
    ratios = variant_ratios(times)
    assert ratios["tail"] == pytest.approx(9.0 / 10.0)
    assert ratios["persistent"] == pytest.approx(11.0 / 9.0)  # best grid, tails included
    assert ratios["flattened"] == pytest.approx(8.0 / 9.0)
    assert ratios["presort"] == pytest.approx(5.0 / 8.0)


def test_a_ratio_without_candidates_on_both_sides_is_left_out():
    assert variant_ratios({GemmTile(64, 64): 1.0}) == {}


def test_presort_is_offered_for_the_up_gemm_only_and_through_tma():
    up, down = tiles_for(128, up=True), tiles_for(128, up=False)
    assert any(t.presort for t in up) and not any(t.presort for t in down)
    assert all(t.tma for t in up if t.presort)
    # Flattening is offered without tails only (a tail's branch keeps the loops apart).
    assert all(t.tail == 0 for t in up + down if t.schedule == "flattened")
    assert {t.schedule for t in tiles_for(16, up=True)} == {"grid"}


def test_group_m_variants_are_the_same_tile_at_every_other_order():
    tile = GemmTile(128, 64, 8, 8, 4, tma=True, tail=2, presort=True)
    variants = group_m_variants(tile)
    assert [v.group_m for v in variants] == [g for g in GROUP_MS if g != 8]
    assert {replace(v, group_m=8) for v in variants} == {tile}


def test_the_refinement_times_the_best_tile_only_at_the_other_orders():
    fast, slow = GemmTile(128, 64, 8, 8, 4, tma=True, tail=2), GemmTile(64, 64, 8, 4, 4)
    timed = []

    def bench(tile):
        timed.append(tile)
        return 0.5 if tile.group_m == 64 else 2.0

    first, orders = refine_group_m({slow: 3.0, fast: 1.0}, bench)
    assert first == fast and timed == group_m_variants(fast)
    assert min(orders, key=orders.get) == replace(fast, group_m=64)
