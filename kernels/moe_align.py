"""Block-align step of the fused MoE: group (token, expert) pairs by expert, pad each run to BLOCK_M.

Shape key: T = tokens, K = top-k, P = T*K pairs, E = experts, BM = rows per block,
NB = cdiv(P, BM) + min(E, P) blocks at most (each used expert adds at most one partial block).

A pair is named by its flat index p = t*K + k into topk_ids.view(-1): p // K is the token,
topk_weights[p] its weight, and the down GEMM writes its output row p. The intermediate
between the GEMMs is kept in this alignment's own row order (row r of sorted_pair_ids).

Example, BM = 4; expert 0 has 3 pairs, expert 1 none, expert 2 has 5 (P = 8):

    block:              |    0    |    1    |    2    | 3 ...
    sorted_pair_ids:    | p p p 8 | p p p p | p 8 8 8 | (never written)
    block_expert_ids:   |    0    |    2    |    2    | -1 ...
    num_padded = 12

The value P marks a padding row; the GEMM masks it. Rows past num_padded are never written
and never read (their blocks have expert id -1 and the GEMM exits before loading them).

Launcher:

    moe_align_block_size(topk_ids [T, K] int32|int64, num_experts: int, block_m: int) -> MoeAlignment

The order of pairs inside one expert's run is not specified (the multi-program path ranks
them with atomics); the fused MoE's result does not depend on it because each GEMM row is
computed on its own. No host synchronisation: the launcher is safe inside a CUDA graph.
"""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

# The default path (align_variant), chosen from GPU timings: one program
# with the scan while it has at most 64 pairs or few experts (<= 16), and a [pairs, experts]
# one-hot of <= 16384 cells; else the chunked kernels. Past those limits the scan's time runs
# away with the pairs, so the limits must not grow without timing it again. The sort rank was
# faster at some sizes but its output has not been checked on a GPU, so no size takes it by
# default. (A third rank, by a [pairs, pairs] comparison, was timed beside them and dropped:
# best at one size, several times slower than chunked at larger ones.)
_SCAN_MAX_PAIRS = 64
_SCAN_FEW_EXPERTS = 16
_SINGLE_PROGRAM_MAX_CELLS = 16384
# Triton's largest block: a single-program path's [pairs, experts] one-hot must fit in it.
_MAX_BLOCK_ELEMENTS = 1 << 20
# Pairs per program in the multi-program path.
_CHUNK = 1024
_BLOCK_IDS_PER_STEP = tl.constexpr(256)


@dataclass(frozen=True)
class MoeAlignment:
    sorted_pair_ids: torch.Tensor  # [NB * BM] int32; P marks padding
    block_expert_ids: torch.Tensor  # [NB] int32; -1 past the last used block
    num_padded: torch.Tensor  # [1] int32 on the device: rows in use, a multiple of BM
    block_m: int
    num_pairs: int
    # [NB, 3] int32 page ids (w1, w3, w2) of each block's expert, copied from the expert
    # table so that a GEMM tile finds its page with one load; None when no table was given.
    block_pages: torch.Tensor | None = None

    @property
    def max_blocks(self) -> int:
        return self.block_expert_ids.numel()


def max_num_blocks(num_pairs: int, num_experts: int, block_m: int) -> int:
    return triton.cdiv(num_pairs, block_m) + min(num_experts, num_pairs)


@triton.jit
def _write_pads_and_block_experts(
    counts,  # [EXPERTS] int32
    sorted_ptr,
    block_expert_ptr,
    num_padded_ptr,
    table_ptr,  # [E, 3] expert table, read only if WITH_PAGES
    block_pages_ptr,  # [NB, 3] written only if WITH_PAGES
    num_pairs,
    max_blocks,
    BLOCK_M: tl.constexpr,
    EXPERTS: tl.constexpr,
    WITH_PAGES: tl.constexpr,
):
    """Write padding rows, block experts and num_padded; return each expert's first row."""
    padded = tl.cdiv(counts, BLOCK_M) * BLOCK_M
    ends = tl.cumsum(padded, axis=0)
    starts = ends - padded
    total = tl.sum(padded, axis=0)
    tl.store(num_padded_ptr, total)
    # Padding rows: [start + count, start + padded) of each expert.
    j = tl.arange(0, BLOCK_M)
    pad_pos = (starts + counts)[:, None] + j[None, :]  # [EXPERTS, BM]
    pad_mask = j[None, :] < (padded - counts)[:, None]
    tl.store(sorted_ptr + pad_pos, tl.zeros_like(pad_pos) + num_pairs, mask=pad_mask)
    # A block's expert is the first one whose run ends after the block's first row.
    for b0 in range(0, max_blocks, _BLOCK_IDS_PER_STEP):
        b = b0 + tl.arange(0, _BLOCK_IDS_PER_STEP)
        row = b * BLOCK_M
        expert = tl.sum((ends[None, :] <= row[:, None]).to(tl.int32), axis=1)
        expert = tl.where(row < total, expert, -1)
        tl.store(block_expert_ptr + b, expert, mask=b < max_blocks)
        if WITH_PAGES:
            # Only experts that own a block are looked up: unrouted table rows stay unread.
            routed = (b < max_blocks) & (expert >= 0)
            for col in tl.static_range(3):
                page = tl.load(table_ptr + expert * 3 + col, mask=routed, other=0)
                tl.store(block_pages_ptr + b * 3 + col, page, mask=b < max_blocks)
    return starts


@triton.jit(do_not_specialize=["num_pairs", "max_blocks"])  # batch-dependent ints
def _align_single_program_kernel(
    topk_ids_ptr,
    sorted_ptr,
    block_expert_ptr,
    num_padded_ptr,
    table_ptr,
    block_pages_ptr,
    num_pairs,
    max_blocks,
    BLOCK_M: tl.constexpr,
    PAIRS: tl.constexpr,
    EXPERTS: tl.constexpr,
    WITH_PAGES: tl.constexpr,
    RANK: tl.constexpr,  # "scan" or "sort": how pairs are ranked (see below)
):
    p = tl.arange(0, PAIRS)
    expert_of_pair = tl.load(topk_ids_ptr + p, mask=p < num_pairs, other=-1).to(tl.int32)
    e = tl.arange(0, EXPERTS)
    onehot = (expert_of_pair[:, None] == e[None, :]).to(tl.int32)  # [PAIRS, EXPERTS]
    counts = tl.sum(onehot, axis=0)
    starts = _write_pads_and_block_experts(
        counts, sorted_ptr, block_expert_ptr, num_padded_ptr, table_ptr, block_pages_ptr,
        num_pairs, max_blocks, BLOCK_M, EXPERTS, WITH_PAGES,
    )  # fmt: skip
    # A pair's stable rank inside its expert = the earlier pairs routed to the same expert.
    if RANK == "sort":  # sort (expert, pair) keys: slot i holds the i-th pair in expert order
        valid = p < num_pairs
        key = tl.where(valid, expert_of_pair, EXPERTS) * PAIRS + p
        ordered = tl.sort(key)
        slot_expert, slot_pair = ordered // PAIRS, ordered % PAIRS
        first = tl.cumsum(counts, axis=0) - counts  # each expert's first slot
        slot_onehot = (slot_expert[:, None] == e[None, :]).to(tl.int32)  # [PAIRS, EXPERTS]
        pos = tl.sum(slot_onehot * (starts - first)[None, :], axis=1) + p  # p: the slot index
        tl.store(sorted_ptr + pos, slot_pair, mask=slot_expert < EXPERTS)
    else:  # a running count down the one-hot's pair axis
        rank = tl.cumsum(onehot, axis=0) - onehot
        pos = tl.sum(onehot * (starts[None, :] + rank), axis=1)
        tl.store(sorted_ptr + pos, p, mask=p < num_pairs)


@triton.jit(do_not_specialize=["num_pairs", "max_blocks"])
def _align_offsets_kernel(
    topk_ids_ptr,
    cursor_ptr,  # [EXPERTS] int32, written here: each expert's first row
    sorted_ptr,
    block_expert_ptr,
    num_padded_ptr,
    table_ptr,
    block_pages_ptr,
    num_pairs,
    num_experts,
    max_blocks,
    BLOCK_M: tl.constexpr,
    EXPERTS: tl.constexpr,
    WITH_PAGES: tl.constexpr,
    CHUNK: tl.constexpr,
):
    # Counted by one program, a chunk at a time: no global atomics, so no memset before.
    counts = tl.zeros((EXPERTS,), dtype=tl.int32)
    for start in range(0, num_pairs, CHUNK):
        p = start + tl.arange(0, CHUNK)
        expert = tl.load(topk_ids_ptr + p, mask=p < num_pairs, other=0).to(tl.int32)
        counts += tl.histogram(expert, EXPERTS, mask=p < num_pairs)
    starts = _write_pads_and_block_experts(
        counts, sorted_ptr, block_expert_ptr, num_padded_ptr, table_ptr, block_pages_ptr,
        num_pairs, max_blocks, BLOCK_M, EXPERTS, WITH_PAGES,
    )  # fmt: skip
    e = tl.arange(0, EXPERTS)
    tl.store(cursor_ptr + e, starts, mask=e < num_experts)


@triton.jit(do_not_specialize=["num_pairs"])
def _align_scatter_kernel(topk_ids_ptr, cursor_ptr, sorted_ptr, num_pairs, CHUNK: tl.constexpr):
    p = tl.program_id(0) * CHUNK + tl.arange(0, CHUNK)
    valid = p < num_pairs
    expert = tl.load(topk_ids_ptr + p, mask=valid, other=0).to(tl.int32)
    pos = tl.atomic_add(cursor_ptr + expert, 1, mask=valid)  # the next free row of its run
    tl.store(sorted_ptr + pos, p, mask=valid)


# How a call aligns its pairs: one program ranking the pairs by a scan of its [pairs, experts]
# one-hot or by sorting (expert, pair) keys; or two kernels over chunks of pairs (the counts
# and offsets in one program, then a scatter that takes each pair's row by an atomic on its
# expert's cursor).
ALIGN_PATHS = ("scan", "sort", "chunked")


def align_variant(num_pairs: int, num_experts: int, block_m: int) -> tuple:
    """What decides which compiled align kernels a call launches (the engine's warm-up
    enumerates it): the path ``moe_align_block_size`` takes by default, with the sizes its
    kernels are compiled for."""
    experts_p2 = triton.next_power_of_2(num_experts)
    pairs_p2 = triton.next_power_of_2(max(num_pairs, 1))
    small = pairs_p2 <= _SCAN_MAX_PAIRS or experts_p2 <= _SCAN_FEW_EXPERTS
    if small and pairs_p2 * experts_p2 <= _SINGLE_PROGRAM_MAX_CELLS:
        return ("scan", pairs_p2, experts_p2, block_m)
    return ("chunked", experts_p2, block_m)


def moe_align_block_size(
    topk_ids: torch.Tensor,
    num_experts: int,
    block_m: int,
    expert_table: torch.Tensor | None = None,
    *,
    path: str | None = None,
) -> MoeAlignment:
    """Group the pairs of ``topk_ids`` [T, K] by expert into blocks of ``block_m`` rows.

    With ``expert_table`` (int32 [E, 3], contiguous) each block's page ids are copied into
    ``block_pages``. Expert ids must lie in [0, num_experts); they are not checked (that
    would need a host synchronisation). ``path`` (one of ALIGN_PATHS) overrides the one
    ``align_variant`` picks by size: for benchmarks and tests.
    """
    if topk_ids.dim() != 2 or topk_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"topk_ids must be a 2-D int32/int64 tensor [T, K]; got {tuple(topk_ids.shape)} "
            f"{topk_ids.dtype}"
        )
    if num_experts < 1:
        raise ValueError(f"num_experts must be >= 1; got {num_experts}")
    if block_m < 16 or block_m & (block_m - 1):
        raise ValueError(f"block_m must be a power of two >= 16; got {block_m}")
    if path is not None and path not in ALIGN_PATHS:
        raise ValueError(f"path must be one of {list(ALIGN_PATHS)}; got {path!r}")
    ids = topk_ids.contiguous().view(-1)
    num_pairs = ids.numel()
    device = ids.device
    nb = max_num_blocks(num_pairs, num_experts, block_m)
    sorted_ids = torch.empty(nb * block_m, dtype=torch.int32, device=device)
    block_experts = torch.empty(nb, dtype=torch.int32, device=device)
    num_padded = torch.empty(1, dtype=torch.int32, device=device)
    with_pages = expert_table is not None
    block_pages = torch.empty(nb, 3, dtype=torch.int32, device=device) if with_pages else None
    table = expert_table if with_pages else block_experts  # placeholder pointer when unused
    pages = block_pages if with_pages else block_experts
    experts_p2 = triton.next_power_of_2(num_experts)
    pairs_p2 = triton.next_power_of_2(max(num_pairs, 1))
    path = path or align_variant(num_pairs, num_experts, block_m)[0]
    if path != "chunked":
        if pairs_p2 * experts_p2 > _MAX_BLOCK_ELEMENTS:
            raise ValueError(
                f"path {path!r} needs a [{pairs_p2}, {experts_p2}] block in one program, over "
                f"Triton's {_MAX_BLOCK_ELEMENTS} elements; use 'chunked' or leave path unset"
            )
        _align_single_program_kernel[(1,)](
            ids, sorted_ids, block_experts, num_padded, table, pages, num_pairs, nb,
            BLOCK_M=block_m, PAIRS=pairs_p2, EXPERTS=experts_p2, WITH_PAGES=with_pages,
            RANK=path, num_warps=4,
        )  # fmt: skip
    else:
        cursor = torch.empty(num_experts, dtype=torch.int32, device=device)
        _align_offsets_kernel[(1,)](
            ids, cursor, sorted_ids, block_experts, num_padded, table, pages,
            num_pairs, num_experts, nb,
            BLOCK_M=block_m, EXPERTS=experts_p2, WITH_PAGES=with_pages, CHUNK=_CHUNK,
            num_warps=4,
        )  # fmt: skip
        grid = (triton.cdiv(num_pairs, _CHUNK),)
        _align_scatter_kernel[grid](ids, cursor, sorted_ids, num_pairs, CHUNK=_CHUNK)
    return MoeAlignment(sorted_ids, block_experts, num_padded, block_m, num_pairs, block_pages)


def moe_align_block_size_reference(
    topk_ids: torch.Tensor, num_experts: int, block_m: int
) -> MoeAlignment:
    """Torch twin of ``moe_align_block_size`` with a stable order inside each expert."""
    ids = topk_ids.reshape(-1).to(torch.int64)
    num_pairs = ids.numel()
    nb = max_num_blocks(num_pairs, num_experts, block_m)
    sorted_ids = torch.full((nb * block_m,), -1, dtype=torch.int32)
    block_experts = torch.full((nb,), -1, dtype=torch.int32)
    row = 0
    for expert in range(num_experts):
        pairs = torch.nonzero(ids.cpu() == expert).view(-1)
        if pairs.numel() == 0:
            continue
        padded = triton.cdiv(pairs.numel(), block_m) * block_m
        sorted_ids[row : row + padded] = num_pairs
        sorted_ids[row : row + pairs.numel()] = pairs.to(torch.int32)
        block_experts[row // block_m : (row + padded) // block_m] = expert
        row += padded
    num_padded = torch.tensor([row], dtype=torch.int32)
    return MoeAlignment(sorted_ids, block_experts, num_padded, block_m, num_pairs)
