"""KV write: copy each new token's K and V into its slot of the paged KV cache.

Shape key: T = new tokens, P = KV pages, Hkv = KV heads, Dh = head size, 16 = tokens per page.

    write_kv_pages(k [T, Hkv, Dh], v [T, Hkv, Dh], kv_pages [P, 2, 16, Hkv, Dh], slots [T] int64) -> None

slot = page_id * 16 + offset in the page; a negative slot skips the token (padding in a
CUDA-graph batch). kv_pages[page, 0] holds K and kv_pages[page, 1] holds V. k and v may be
row-strided views (e.g. slices of a fused qkv projection) as long as each token's
[Hkv, Dh] is contiguous.
"""

import torch
import triton
import triton.language as tl

from rimuru.kernels.kv_pages import PAGE_TOKENS, check_kv_pages


# A layer's slot mapping is a row view of [L, T]: its alignment varies with T, so it is not
# specialised (one variant).
@triton.jit(do_not_specialize_on_alignment=["slots_ptr"])
def _write_kv_kernel(
    k_ptr,
    v_ptr,
    kv_ptr,
    slots_ptr,
    stride_kt,
    stride_vt,
    stride_page,
    stride_kind,
    stride_tok,
    ROW: tl.constexpr,  # Hkv * Dh
    BLOCK: tl.constexpr,
):
    t = tl.program_id(0)
    slot = tl.load(slots_ptr + t)
    if slot < 0:
        return
    i = tl.arange(0, BLOCK)
    mask = i < ROW
    dst = kv_ptr + (slot // 16) * stride_page + (slot % 16) * stride_tok + i
    tl.store(dst, tl.load(k_ptr + t.to(tl.int64) * stride_kt + i, mask=mask), mask=mask)
    tl.store(
        dst + stride_kind, tl.load(v_ptr + t.to(tl.int64) * stride_vt + i, mask=mask), mask=mask
    )


def _check_token_rows(name: str, t: torch.Tensor, kv_pages: torch.Tensor) -> None:
    if t.dim() != 3 or tuple(t.shape[1:]) != tuple(kv_pages.shape[3:]):
        raise ValueError(
            f"{name} must be [T, Hkv, Dh] = [T, {kv_pages.shape[3]}, {kv_pages.shape[4]}]; "
            f"got {tuple(t.shape)}"
        )
    if t.dtype != kv_pages.dtype or t.device != kv_pages.device:
        raise ValueError(
            f"{name} must be {kv_pages.dtype} on {kv_pages.device}; got {t.dtype} on {t.device}"
        )
    if t.stride(2) != 1 or t.stride(1) != t.shape[2]:
        raise ValueError(f"{name}[t] must be a contiguous [Hkv, Dh]; got strides {t.stride()}")


def write_kv_pages(
    k: torch.Tensor, v: torch.Tensor, kv_pages: torch.Tensor, slots: torch.Tensor
) -> None:
    check_kv_pages(kv_pages)
    _check_token_rows("k", k, kv_pages)
    _check_token_rows("v", v, kv_pages)
    if k.shape[0] != v.shape[0] or slots.shape != (k.shape[0],) or slots.dtype != torch.int64:
        raise ValueError(
            f"slots must be int64 [T={k.shape[0]}] and v must have k's T; got slots "
            f"{tuple(slots.shape)} {slots.dtype}, v {tuple(v.shape)}"
        )
    if slots.shape[0] > 1 and slots.stride(0) != 1:  # the kernel reads slots_ptr + t
        raise ValueError(f"slots must have unit stride; got stride {slots.stride(0)}")
    if slots.device != kv_pages.device:
        raise ValueError(f"slots is on {slots.device}; move it to {kv_pages.device}")
    if k.shape[0] == 0:
        return
    row = k.shape[1] * k.shape[2]
    _write_kv_kernel[(k.shape[0],)](
        k, v, kv_pages, slots, k.stride(0), v.stride(0),
        kv_pages.stride(0), kv_pages.stride(1), kv_pages.stride(2),
        ROW=row, BLOCK=triton.next_power_of_2(row),
    )  # fmt: skip


def write_kv_pages_reference(
    k: torch.Tensor, v: torch.Tensor, kv_pages: torch.Tensor, slots: torch.Tensor
) -> None:
    valid = slots >= 0
    page, offset = slots[valid] // PAGE_TOKENS, slots[valid] % PAGE_TOKENS
    kv_pages[page, 0, offset] = k[valid]
    kv_pages[page, 1, offset] = v[valid]
