"""Copy-in of routed, offloaded experts decided on the device: no host synchronisation, so a
step with offloaded experts can still be captured in a CUDA graph.

Shape key: E = experts of the layer, S = loading-buffer slots, I = expert intermediate,
D = hidden.

    copy_routed_experts(counts [E] int64, offloaded [S] int32, w1 [E, I, D], w3 [E, I, D],
                        w2 [E, D, I], pages [P, >= I*D], slot_rows [3S] int32,
                        copied [1] int32) -> None

offloaded[s] is the expert that lives in slot s while it is off the device (-1: slot
unused). For every s with offloaded[s] = e >= 0 and counts[e] > 0, the three matrices of e
are copied into rows slot_rows[3s], slot_rows[3s+1], slot_rows[3s+2] of `pages` (the pool's
expert pages: a slot is three pool pages); every other row is left as it is. `copied`
grows by the number of experts copied (the engine's statistics, counted here so that they
need no launches of their own). The weights are read where they lie on the host: w1, w3 and w2 are pinned host tensors, which a CUDA
kernel reads over PCIe through unified addressing (Triton accepts pinned pointers). On the
CPU (tests, the interpreter) they are ordinary tensors.

Why a kernel and not cudaMemcpyAsync: which experts to copy depends on this step's routing,
which lives on the device. Copies issued by the host need the routing on the host first, a
synchronisation per layer, and a graph cannot hold that.
"""

import torch
import triton
import triton.language as tl

_BLOCK = 4096  # elements per loop step: 8 KiB of bf16, read as wide vector loads
_PROGRAMS_PER_MATRIX = 8  # each copies a run of consecutive chunks; most slots exit at once


# S and the matrix sizes are fixed per model. A layer's row of `offloaded` and the step's
# counts start at varying alignments: not specialised, one compiled variant.
@triton.jit(do_not_specialize_on_alignment=["offloaded_ptr", "counts_ptr"])
def _copy_routed_kernel(
    counts_ptr,
    offloaded_ptr,
    w1_ptr,
    w3_ptr,
    w2_ptr,
    buffer_ptr,
    rows_ptr,  # [3S] int32: the row of `buffer` each (slot, matrix) is copied into
    copied_ptr,  # [1] int32: one per expert copied
    page_elems,  # elements between two buffer rows
    matrix_elems,  # I * D
    chunks_per_program,  # each program copies this many consecutive BLOCK chunks
    BLOCK: tl.constexpr,
):
    slot = tl.program_id(0)
    matrix = tl.program_id(1)  # 0 w1, 1 w3, 2 w2
    expert = tl.load(offloaded_ptr + slot)
    if expert >= 0:  # noqa: SIM102 (nested: never read counts[-1])
        if tl.load(counts_ptr + expert) > 0:
            if matrix == 0:
                src = w1_ptr
            elif matrix == 1:
                src = w3_ptr
            else:
                src = w2_ptr
            src = src + expert.to(tl.int64) * matrix_elems
            row = tl.load(rows_ptr + 3 * slot + matrix)
            dst = buffer_ptr + row.to(tl.int64) * page_elems
            first = tl.program_id(2) * chunks_per_program
            for j in range(0, chunks_per_program):
                offs = (first + j) * BLOCK + tl.arange(0, BLOCK)
                mask = offs < matrix_elems
                tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)
            if matrix == 0 and tl.program_id(2) == 0:  # once per expert
                tl.atomic_add(copied_ptr, 1)


def _check(counts, offloaded, w1, w3, w2, buffer_pages, slot_rows, copied) -> None:
    if copied.shape != (1,) or copied.dtype != torch.int32:
        raise ValueError(f"copied must be int32 [1]; got {tuple(copied.shape)} {copied.dtype}")
    E, inter, hidden = w1.shape
    if w3.shape != (E, inter, hidden) or w2.shape != (E, hidden, inter):
        raise ValueError(
            f"w1/w3 must be [E, I, D] and w2 [E, D, I]; got {tuple(w1.shape)}, "
            f"{tuple(w3.shape)}, {tuple(w2.shape)}"
        )
    if not all(w.is_contiguous() for w in (w1, w3, w2)):
        raise ValueError("w1, w3 and w2 must be contiguous")
    if counts.shape != (E,) or counts.dtype != torch.int64:
        raise ValueError(f"counts must be int64 [{E}]; got {tuple(counts.shape)} {counts.dtype}")
    if offloaded.dim() != 1 or offloaded.dtype != torch.int32:
        raise ValueError(
            f"offloaded must be int32 [S]; got {tuple(offloaded.shape)} {offloaded.dtype}"
        )
    if slot_rows.shape != (3 * offloaded.shape[0],) or slot_rows.dtype != torch.int32:
        raise ValueError(
            f"slot_rows must be int32 [{3 * offloaded.shape[0]}]; got "
            f"{tuple(slot_rows.shape)} {slot_rows.dtype}"
        )
    if (
        buffer_pages.dim() != 2
        or buffer_pages.shape[1] < inter * hidden
        or buffer_pages.stride(1) != 1
        or buffer_pages.dtype != w1.dtype
    ):
        raise ValueError(
            f"pages must be {w1.dtype} [P, >= {inter * hidden}] "
            f"with unit column stride; got {tuple(buffer_pages.shape)} {buffer_pages.dtype}"
        )


def copy_routed_experts(
    counts: torch.Tensor,
    offloaded: torch.Tensor,
    w1: torch.Tensor,
    w3: torch.Tensor,
    w2: torch.Tensor,
    buffer_pages: torch.Tensor,
    slot_rows: torch.Tensor,
    copied: torch.Tensor,
    *,
    programs_per_matrix: int = _PROGRAMS_PER_MATRIX,
    block: int = _BLOCK,
    num_warps: int = 4,
) -> None:
    """See the module doc. One launch; returns at once (stream-ordered). The keywords set
    the launch, for timing its variants; the defaults are what the engine uses."""
    _check(counts, offloaded, w1, w3, w2, buffer_pages, slot_rows, copied)
    if programs_per_matrix < 1 or block < 16 or block & (block - 1) or num_warps not in (1, 2, 4, 8, 16, 32):  # fmt: skip
        raise ValueError(
            f"programs_per_matrix must be >= 1, block a power of two >= 16 and num_warps a "
            f"power of two <= 32; got {programs_per_matrix}, {block}, {num_warps}"
        )
    matrix_elems = w1.shape[1] * w1.shape[2]
    if offloaded.shape[0] == 0:
        return
    chunks = triton.cdiv(matrix_elems, block)
    per_program = triton.cdiv(chunks, min(programs_per_matrix, chunks))
    grid = (offloaded.shape[0], 3, triton.cdiv(chunks, per_program))
    _copy_routed_kernel[grid](
        counts, offloaded, w1, w3, w2, buffer_pages, slot_rows, copied, buffer_pages.stride(0),
        matrix_elems, per_program, BLOCK=block, num_warps=num_warps,
    )  # fmt: skip


def copy_routed_experts_reference(
    counts, offloaded, w1, w3, w2, buffer_pages, slot_rows, copied
) -> None:  # fmt: skip
    """The same copies in torch (the CPU path; reads the routing on the host)."""
    _check(counts, offloaded, w1, w3, w2, buffer_pages, slot_rows, copied)
    matrix_elems = w1.shape[1] * w1.shape[2]
    rows = slot_rows.tolist()
    for slot, expert in enumerate(offloaded.tolist()):
        if expert >= 0 and int(counts[expert]) > 0:
            for m, w in enumerate((w1, w3, w2)):
                buffer_pages[rows[3 * slot + m], :matrix_elems].copy_(w[expert].reshape(-1))
            copied += 1
