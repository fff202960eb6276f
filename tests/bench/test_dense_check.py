"""bench/dense_check.py's dense problem and its output check, under the interpreter (fp32)."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from dense_check import check_dense, dense_routing, make_problem
from tune_moe import MoeShape

from rimuru.kernels.moe_configs import GemmTile

SHAPE = MoeShape("tiny", 4, 32, 64, 2)  # E, I, D, K


def _problem(top_k_tokens: int = 24):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(top_k_tokens, 64, generator=gen)
    w13 = torch.randn(4, 64, 64, generator=gen) * 0.125
    w2 = torch.randn(4, 64, 32, generator=gen) * 0.125
    return make_problem(SHAPE, x, w13, w2, *dense_routing(top_k_tokens, 2, "cpu"), 16)


def test_dense_routing_puts_every_pair_in_expert_0_without_padding():
    p = _problem()
    assert int(p.align.num_padded) == 48  # P = 24 * 2 rows, a multiple of block_m: no pad
    assert p.align.block_expert_ids[:3].tolist() == [0, 0, 0]
    assert sorted(p.align.sorted_pair_ids[:48].tolist()) == list(range(48))


def test_the_kernel_matches_torch_on_the_dense_problem():
    up, down = check_dense(_problem(), GemmTile(32, 32), GemmTile(32, 32))
    assert up < 1e-5 and down < 1e-5


def test_a_wrong_expert_is_caught():
    # The check's reference reads expert 0's matrices: blocks that send the kernel to
    # expert 1's must fail it.
    p = _problem()
    p.align.block_expert_ids[:3] = 1
    up, _ = check_dense(p, GemmTile(32, 32), GemmTile(32, 32))
    assert up > 0.5


def test_the_plot_divides_each_time_by_the_routed_floor(tmp_path):
    from dense_check import PLOT_BARS, plot, routed_floor
    from tune_moe import MODELS

    shape = MODELS["qwen3-30b-a3b"]
    gemm_row = {"cublas_us": 100.0, "dense_best_us": 120.0, "routed_us": 300.0, "grouped_us": 330.0}
    rows = [{"model": shape.name, "tokens": 2048, "up": gemm_row, "down": gemm_row},
            {"model": "Mixtral-8x7B", "tokens": 1024, "error": "failed"}]  # fmt: skip
    heights = plot(rows, tmp_path / "dense.png")
    floors = routed_floor(shape, 2048)
    # Qwen3 at 2048 tokens is bound by its weights' bytes, not its FLOPs.
    assert floors["up"] > 2 * 2048 * 8 * 2048 * 2 * 768 / 755e12 * 1e6
    for key, label in PLOT_BARS:
        assert heights[label] == [gemm_row[key] / floors["up"], gemm_row[key] / floors["down"]]
    assert (tmp_path / "dense.png").read_bytes()[:4] == b"\x89PNG"


def test_padding_rows_are_left_out_of_the_check():
    # 25 tokens x top-2 = 50 pairs: the last block of 16 rows holds 2 pairs and 14 padding
    # rows, which must not be read as pairs (their id is num_pairs, past every token).
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(25, 64, generator=gen)
    w13 = torch.randn(4, 64, 64, generator=gen) * 0.125
    w2 = torch.randn(4, 64, 32, generator=gen) * 0.125
    p = make_problem(SHAPE, x, w13, w2, *dense_routing(25, 2, "cpu"), 16)
    assert int(p.align.num_padded) == 64
    up, down = check_dense(p, GemmTile(32, 32), GemmTile(32, 32))
    assert up < 1e-5 and down < 1e-5


def test_a_nan_in_the_compared_rows_fails_the_check():
    from dense_check import output_ok

    p = _problem()
    p.x[3] = float("nan")  # the rows of token 3's pairs come out NaN
    up, down = check_dense(p, GemmTile(32, 32), GemmTile(32, 32))
    assert not output_ok(up) and not output_ok(down)
    assert output_ok(0.003) and not output_ok(0.02)
