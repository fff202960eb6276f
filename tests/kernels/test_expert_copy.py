"""copy_routed_experts (interpreter) == its torch reference: exactly the routed, offloaded
experts land in their slots' pages (rows of the pool, scattered); every other row keeps its
poison."""

import pytest
import torch

from rimuru.kernels import copy_routed_experts, copy_routed_experts_reference, expert_copy


def _case(seed: int, E=6, inter=24, hidden=40, slots=4, page_extra=8, dtype=torch.float16):
    g = torch.Generator().manual_seed(seed)
    w1 = torch.randn(E, inter, hidden, generator=g).to(dtype)
    w3 = torch.randn(E, inter, hidden, generator=g).to(dtype)
    w2 = torch.randn(E, hidden, inter, generator=g).to(dtype)
    buffer = torch.full((3 * slots + 2, inter * hidden + page_extra), -7.0, dtype=dtype)
    return w1, w3, w2, buffer


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_copies_exactly_the_routed_offloaded_experts(dtype):
    w1, w3, w2, buffer = _case(0, dtype=dtype)
    offloaded = torch.tensor([4, -1, 1, 5], dtype=torch.int32)  # slot 1 unused
    counts = torch.tensor([3, 0, 0, 9, 1, 2], dtype=torch.int64)  # 1 not routed; 4 and 5 are
    # each slot's w1, w3, w2 rows, scattered as pool pages are; slot 1 holds no pages
    rows = torch.tensor([13, 0, 6, -1, -1, -1, 1, 2, 3, 9, 4, 11], dtype=torch.int32)
    want = buffer.clone()
    copied_ref, copied = torch.zeros(1, dtype=torch.int32), torch.full((1,), 5, dtype=torch.int32)
    copy_routed_experts_reference(counts, offloaded, w1, w3, w2, want, rows, copied_ref)
    copy_routed_experts(counts, offloaded, w1, w3, w2, buffer, rows, copied)
    assert torch.equal(buffer, want)
    assert copied_ref.item() == 2 and copied.item() == 5 + 2  # experts 4 and 5, added to 5
    n = w1.shape[1] * w1.shape[2]
    assert torch.equal(buffer[13, :n], w1[4].reshape(-1))  # slot 0 = expert 4
    assert torch.equal(buffer[6, :n], w2[4].reshape(-1))
    assert torch.equal(buffer[4, :n], w3[5].reshape(-1))  # slot 3 = expert 5
    assert torch.equal(buffer[11, :n], w2[5].reshape(-1))
    untouched = [1, 2, 3, 5, 7, 8, 10, 12]  # slot 2's (expert 1, not routed), unowned rows
    assert bool((buffer[untouched] == -7.0).all())
    assert bool((buffer[:, n:] == -7.0).all())  # nothing past a matrix's end


@pytest.mark.parametrize("inter, hidden", [(64, 100), (128, 300)])
def test_a_matrix_of_many_chunks_is_copied_whole(inter, hidden):
    """6,400 elements: 2 chunks of 4,096; 38,400: 10 chunks, 2 per program over 5 programs."""
    w1, w3, w2, buffer = _case(1, E=3, inter=inter, hidden=hidden, slots=1)
    offloaded = torch.tensor([2], dtype=torch.int32)
    counts = torch.tensor([0, 0, 1], dtype=torch.int64)
    copied = torch.zeros(1, dtype=torch.int32)
    rows = torch.arange(3, dtype=torch.int32)
    copy_routed_experts(counts, offloaded, w1, w3, w2, buffer, rows, copied)
    assert copied.item() == 1  # once per expert, whatever the number of programs
    n = inter * hidden
    for m, w in enumerate((w1, w3, w2)):
        assert torch.equal(buffer[m, :n], w[2].reshape(-1))


@pytest.mark.parametrize(
    "programs, block, warps, grid_z", [(32, 1024, 8, 6), (128, 256, 4, 21), (3, 512, 2, 3)]
)
def test_every_launch_of_the_sweep_copies_the_same(monkeypatch, programs, block, warps, grid_z):
    """Other launch shapes than the default: each is launched as asked (5,200
    elements a matrix: chunks of `block`, spread over at most `programs` programs) and must
    copy what the default does, including a last program whose run passes the matrix's end."""
    w1, w3, w2, buffer = _case(2, E=5, inter=40, hidden=130, slots=3)
    offloaded = torch.tensor([3, 0, 4], dtype=torch.int32)
    counts = torch.tensor([1, 0, 0, 2, 1], dtype=torch.int64)
    want, copied_want = buffer.clone(), torch.zeros(1, dtype=torch.int32)
    rows = torch.arange(8, -1, -1, dtype=torch.int32)
    copy_routed_experts(counts, offloaded, w1, w3, w2, want, rows, copied_want)
    launches = []
    kernel = expert_copy._copy_routed_kernel

    class Recording:  # what was launched, then the real launch
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launches.append((grid, kwargs["BLOCK"], kwargs["num_warps"]))
                return kernel[grid](*args, **kwargs)

            return launch

    monkeypatch.setattr(expert_copy, "_copy_routed_kernel", Recording())
    copied = torch.zeros(1, dtype=torch.int32)
    copy_routed_experts(counts, offloaded, w1, w3, w2, buffer, rows, copied,
                        programs_per_matrix=programs, block=block, num_warps=warps)  # fmt: skip
    assert launches == [((3, 3, grid_z), block, warps)]
    assert torch.equal(buffer, want) and copied.item() == copied_want.item() == 3


@pytest.mark.parametrize(
    "launch", [dict(programs_per_matrix=0), dict(block=1000), dict(num_warps=3)]
)
def test_bad_launches_are_refused_before_anything_is_copied(launch):
    w1, w3, w2, buffer = _case(3, slots=1)
    before = buffer.clone()
    counts, copied = torch.ones(6, dtype=torch.int64), torch.zeros(1, dtype=torch.int32)
    with pytest.raises(ValueError, match="power of two"):
        copy_routed_experts(counts, torch.tensor([2], dtype=torch.int32), w1, w3, w2, buffer,
                            torch.arange(3, dtype=torch.int32), copied, **launch)  # fmt: skip
    assert torch.equal(buffer, before) and copied.item() == 0


def test_bad_shapes_are_refused_with_what_was_expected():
    w1, w3, w2, buffer = _case(2)
    counts, copied = torch.zeros(6, dtype=torch.int64), torch.zeros(1, dtype=torch.int32)
    rows = torch.arange(12, dtype=torch.int32)
    slots = torch.zeros(4, dtype=torch.int32)
    with pytest.raises(ValueError, match="offloaded must be int32"):
        copy_routed_experts(counts, torch.zeros(4), w1, w3, w2, buffer, rows, copied)
    with pytest.raises(ValueError, match="slot_rows must be int32 \\[12\\]"):
        copy_routed_experts(counts, slots, w1, w3, w2, buffer, rows[:9], copied)
    with pytest.raises(ValueError, match="pages must be"):
        copy_routed_experts(counts, slots, w1, w3, w2, buffer[:, :10], rows, copied)
    with pytest.raises(ValueError, match="copied"):
        copy_routed_experts(counts, slots, w1, w3, w2, buffer, rows, counts)
