"""The Fig. 4 and Fig. 9 style PNGs are written and carry real images."""

from __future__ import annotations

import math

import pytest
from matplotlib.image import imread

from rimuru.dataplane.bench.plots import plot_memory_split, plot_rate_sweep

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def assert_real_png(path, min_width: int) -> None:
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    assert len(data) > 10_000
    height, width = imread(path).shape[:2]
    assert width >= min_width and height >= 300


def test_memory_split_one_panel_per_policy(tmp_path, make_result):
    results = [
        make_result("resident", 10.0, elastic=False),
        make_result("fixed", 10.0, elastic=False),
        make_result("elastic", 10.0, num_steps=90),
    ]
    path = plot_memory_split(results, tmp_path / "fig4.png")
    assert_real_png(path, min_width=3 * 4 * 120)  # three ~4.4-inch panels at 120 dpi


def test_rate_sweep_one_line_per_policy(tmp_path, make_result):
    results = [make_result(p, rate) for p in ("resident", "elastic") for rate in (1.0, 4.0, 2.0)]
    path = plot_rate_sweep(results, tmp_path / "fig9.png", stat="p99")
    assert_real_png(path, min_width=12 * 120)


def test_bad_plot_requests_are_refused(tmp_path, make_result):
    with pytest.raises(ValueError, match="stat must be one of"):
        plot_rate_sweep([make_result("elastic", 1.0)], tmp_path / "a.png", stat="p50")
    with pytest.raises(ValueError, match="leave out runs at rate inf"):
        plot_rate_sweep([make_result("elastic", math.inf)], tmp_path / "a.png")
    with pytest.raises(ValueError, match=r"ending in \.png"):
        plot_memory_split([make_result("elastic", 1.0)], tmp_path / "a.svg")
    with pytest.raises(ValueError, match="2 labels for 1 results"):
        plot_memory_split([make_result("elastic", 1.0)], tmp_path / "a.png", labels=["a", "b"])
    assert not (tmp_path / "a.png").exists()
    with pytest.raises(ValueError, match="no step records"):
        plot_memory_split([make_result("elastic", 1.0, num_steps=0)], tmp_path / "a.png")


def test_memory_split_panels_take_the_given_labels(tmp_path, make_result):
    results = [make_result("elastic", math.inf) for _ in range(2)]
    path = plot_memory_split(results, tmp_path / "sweep.png", labels=["limit 0", "limit 30"])
    assert_real_png(path, min_width=2 * 4 * 120)
