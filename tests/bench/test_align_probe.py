"""bench/align_probe.py's alignment check, on CPU alignments (interpreter)."""

import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from align_probe import same_alignment

from rimuru.kernels.moe_align import (
    ALIGN_PATHS,
    moe_align_block_size,
    moe_align_block_size_reference,
)

EXPERTS, BLOCK_M = 5, 16


def _ids():
    gen = torch.Generator().manual_seed(3)
    return torch.rand(20, EXPERTS, generator=gen).topk(2, dim=1).indices.to(torch.int32)


def _table():
    return torch.arange(EXPERTS * 3, dtype=torch.int32).view(EXPERTS, 3) * 7 + 1


@pytest.mark.parametrize("path", ALIGN_PATHS)
def test_every_path_passes_the_check(path):
    ids = _ids()
    got = moe_align_block_size(ids, EXPERTS, BLOCK_M, _table(), path=path)
    assert same_alignment(got, moe_align_block_size_reference(ids, EXPERTS, BLOCK_M), _table())


def test_a_pair_in_another_experts_block_or_a_wrong_page_fails_it():
    ids = _ids()
    ref = moe_align_block_size_reference(ids, EXPERTS, BLOCK_M)
    got = moe_align_block_size(ids, EXPERTS, BLOCK_M, _table())
    swapped = got.sorted_pair_ids.clone()
    first, last = 0, int(ref.num_padded) - BLOCK_M  # first and last blocks: other experts
    swapped[first], swapped[last] = got.sorted_pair_ids[last], got.sorted_pair_ids[first]
    assert not same_alignment(replace(got, sorted_pair_ids=swapped), ref, _table())
    assert not same_alignment(got, ref, _table() + 1)
