"""Block-align step: every pair lands once, in a block of its expert, padding marked."""

import pytest
import torch

from rimuru.kernels.moe_align import (
    ALIGN_PATHS,
    align_variant,
    moe_align_block_size,
    moe_align_block_size_reference,
)


def _routing(num_tokens: int, top_k: int, num_experts: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(num_tokens, num_experts, generator=gen).topk(top_k, dim=1).indices


@pytest.mark.parametrize("path", [None, *ALIGN_PATHS])  # None: the path picked by size
@pytest.mark.parametrize(
    ("num_tokens", "top_k", "num_experts", "block_m"),
    [
        (1, 1, 1, 16),  # one pair
        (5, 3, 7, 16),  # single-program size
        (64, 2, 60, 32),  # single-program size, most experts empty
        (300, 8, 16, 16),  # chunked size (atomics)
        (2000, 2, 8, 64),  # several chunks per program grid
        (257, 4, 33, 128),  # odd expert count, large blocks
    ],
)
def test_alignment_matches_reference(num_tokens, top_k, num_experts, block_m, path):
    ids = _routing(num_tokens, top_k, num_experts, seed=num_tokens)
    got = moe_align_block_size(ids.to(torch.int32), num_experts, block_m, path=path)
    ref = moe_align_block_size_reference(ids, num_experts, block_m)
    used = int(ref.num_padded)
    assert int(got.num_padded) == used
    assert torch.equal(got.block_expert_ids, ref.block_expert_ids)
    assert torch.equal(
        got.sorted_pair_ids[:used].sort().values, ref.sorted_pair_ids[:used].sort().values
    )
    flat = ids.view(-1)
    for block in range(used // block_m):
        rows = got.sorted_pair_ids[block * block_m : (block + 1) * block_m].long()
        real = rows[rows < flat.numel()]
        assert (flat[real] == int(got.block_expert_ids[block])).all()
    assert (got.block_expert_ids[used // block_m :] == -1).all()


@pytest.mark.parametrize("path", ["scan", "sort"])
def test_single_program_paths_keep_pair_order(path):
    ids = torch.tensor([[2, 0], [2, 1], [0, 2]])
    got = moe_align_block_size(ids, 3, 16, path=path)
    ref = moe_align_block_size_reference(ids, 3, 16)
    assert torch.equal(got.sorted_pair_ids[:48], ref.sorted_pair_ids[:48])
    assert got.sorted_pair_ids[:3].tolist() == [
        1,
        4,
        6,
    ]  # expert 0: pairs 1, 4, then padding (P = 6)


@pytest.mark.parametrize(
    ("ids", "experts", "block_m", "match"),
    [
        (torch.zeros(4, dtype=torch.int32), 2, 16, "2-D"),
        (torch.zeros(4, 1, dtype=torch.float32), 2, 16, "int32/int64"),
        (torch.zeros(4, 1, dtype=torch.int32), 0, 16, "num_experts"),
        (torch.zeros(4, 1, dtype=torch.int32), 2, 24, "power of two"),
    ],
)
def test_bad_input_is_refused(ids, experts, block_m, match):
    with pytest.raises(ValueError, match=match):
        moe_align_block_size(ids, experts, block_m)


def test_a_single_program_path_past_tritons_largest_block_is_refused():
    ids = torch.zeros(1200, 1, dtype=torch.int32)  # [2048 pairs, 1024 experts] > 2^20
    with pytest.raises(ValueError, match=r"\[2048, 1024\] block.*use 'chunked'"):
        moe_align_block_size(ids, 1000, 16, path="scan")


def test_an_unknown_path_is_refused():
    with pytest.raises(ValueError, match="path must be one of"):
        moe_align_block_size(torch.zeros(4, 1, dtype=torch.int32), 2, 16, path="radix")


@pytest.mark.parametrize(
    ("pairs", "experts", "path"),
    [
        (64, 128, "scan"),  # Qwen3 at 8 tokens: 12.4-14.4 us on the H200, chunked 16.0
        (128, 128, "chunked"),  # Qwen3 at 16 tokens: the scan took 58.5 us, chunked 15.9
        (128, 60, "chunked"),  # Qwen1.5 at 32 tokens: scan 49.3, chunked 25.9
        (2048, 8, "scan"),  # Mixtral at 1024 tokens: few experts, 16384 cells: 13.0 vs 13.4
        (4096, 8, "chunked"),  # Mixtral at 2048 tokens: the scan took 70.6, chunked 14.0
        (64, 20000, "chunked"),  # a one-hot far past 16384 cells, however few the pairs
    ],
)
def test_the_default_path_follows_the_measured_rule(pairs, experts, path):
    assert align_variant(pairs, experts, 16)[0] == path


@pytest.mark.parametrize("path", ALIGN_PATHS)
def test_every_path_copies_each_blocks_pages_from_the_table(path):
    ids = _routing(40, 4, 12, seed=7)
    table = torch.arange(36, dtype=torch.int32).view(12, 3) * 10 - 50  # loading slots < 0
    got = moe_align_block_size(ids, 12, 16, table, path=path)
    used = int(got.num_padded) // 16
    experts = got.block_expert_ids[:used].long()
    assert torch.equal(got.block_pages[:used], table[experts])
