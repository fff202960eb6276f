"""Gated DeltaNet decode: one token per sequence through the gated delta rule, with each
sequence's recurrent state read from and written back to its page of the pool.

Shape key: S = sequences, P = state pages, Hk/Hv = key/value heads, G = Hv / Hk,
Dk/Dv = head dims, BK/BV = their tile sizes.

    gated_delta_decode(q [S, Hk, Dk], k [S, Hk, Dk], v [S, Hv, Dv], g [S, Hv] fp32,
                       beta [S, Hv] fp32, states [P, Hv, Dk, Dv] fp32,
                       state_pages [S] int32 | int64, scale=None) -> o [S, Hv, Dv]

For each sequence s with state S = states[state_pages[s]] and each value head h (key head
h // G, as transformers' repeat_interleave):

    S <- exp(g) · S;   u = beta · (v - S^T k);   S <- S + k u^T;   o = S^T (scale · q)

and the new S is written back to the same page, in place. q and k come L2-normalised (the
layer's job), in any float dtype; the rule computes in fp32 and o has v's dtype. scale
None is Dk ** -0.5. A page id < 0 marks a padding row (CUDA-graph batches): its o is zeros
and no page is written. The page ids of the other rows must be distinct and < P (not
checked: that would synchronise with the host).

states is the pool's view of its state pages: each page's [Hv, Dk, Dv] is contiguous but
the page stride may exceed Hv·Dk·Dv (a page padded to the pool's slot). One program owns a
[Dk, BV] column block of one head's state, so programs never share a state element and
the in-place update needs no ordering between them.

The checks of a page view and its page ids (check_state_view, check_state_pages) are also
those of causal_conv_states.py.
"""

import torch
import triton
import triton.language as tl

_MAX_KEY_DIM = 256
# A program's [BK, BV] fp32 state tile: 64 registers a thread in 4 warps, no spills. The step is
# bound by moving the states; at Dk = Dv = 128, BV = 64 moved them near the HBM's copy rate
# from 32 sequences up, faster than BV = 32 (which wins slightly below 16 sequences: one
# variant is kept for simplicity).
_STATE_TILE = 8192


# A layer's page ids may be a row view of a [L, S] table: their alignment is not specialised.
@triton.jit(do_not_specialize_on_alignment=["state_pages_ptr"])
def _gated_delta_decode_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    g_ptr,
    beta_ptr,
    states_ptr,
    state_pages_ptr,
    o_ptr,  # [S, Hv, Dv] contiguous
    scale,
    stride_qs,
    stride_qh,
    stride_ks,
    stride_kh,
    stride_vs,
    stride_vh,
    stride_gs,
    stride_betas,
    stride_page,
    GROUP: tl.constexpr,
    KEY_DIM: tl.constexpr,
    VALUE_DIM: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
):
    s = tl.program_id(0)
    h = tl.program_id(1)
    dv = tl.program_id(2) * BV + tl.arange(0, BV)
    vmask = dv < VALUE_DIM
    o_ptrs = o_ptr + (s * tl.num_programs(1) + h) * VALUE_DIM + dv
    page = tl.load(state_pages_ptr + s).to(tl.int64)
    if page < 0:
        tl.store(o_ptrs, tl.zeros((BV,), dtype=o_ptr.dtype.element_ty), mask=vmask)
        return
    dk = tl.arange(0, BK)
    kmask = dk < KEY_DIM
    key_head = h // GROUP
    q = tl.load(q_ptr + s * stride_qs + key_head * stride_qh + dk, mask=kmask, other=0.0)
    k = tl.load(k_ptr + s * stride_ks + key_head * stride_kh + dk, mask=kmask, other=0.0)
    q = q.to(tl.float32) * scale
    k = k.to(tl.float32)
    v = tl.load(v_ptr + s * stride_vs + h * stride_vh + dv, mask=vmask, other=0.0).to(tl.float32)
    decay = tl.exp(tl.load(g_ptr + s * stride_gs + h))
    beta = tl.load(beta_ptr + s * stride_betas + h)
    state_ptrs = (
        states_ptr
        + page * stride_page
        + h * (KEY_DIM * VALUE_DIM)
        + dk[:, None] * VALUE_DIM
        + dv[None, :]
    )
    smask = kmask[:, None] & vmask[None, :]
    state = tl.load(state_ptrs, mask=smask, other=0.0) * decay  # [BK, BV]
    u = beta * (v - tl.sum(state * k[:, None], axis=0))  # [BV]
    state = state + k[:, None] * u[None, :]
    o = tl.sum(state * q[:, None], axis=0)
    tl.store(state_ptrs, state, mask=smask)
    tl.store(o_ptrs, o.to(o_ptr.dtype.element_ty), mask=vmask)


def check_state_view(states: torch.Tensor, page_shape: tuple[int, ...], dtype: torch.dtype):
    """states is [P, *page_shape] of dtype, each page contiguous (any page stride)."""
    if tuple(states.shape[1:]) != page_shape or states.dtype != dtype:
        raise ValueError(
            f"states must be {dtype} [P, {', '.join(map(str, page_shape))}]; got "
            f"{states.dtype} {tuple(states.shape)}"
        )
    expected = 1
    for size, stride in reversed(list(zip(page_shape, states.stride()[1:], strict=True))):
        if size > 1 and stride != expected:  # torch leaves size-1 dims' strides arbitrary
            raise ValueError(
                f"each page of states must be contiguous; got strides {states.stride()}"
            )
        expected *= size


def check_state_pages(state_pages: torch.Tensor, num_seqs: int, device: torch.device) -> None:
    if state_pages.shape != (num_seqs,) or state_pages.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"state_pages must be int32 or int64 [{num_seqs}]; got "
            f"{state_pages.dtype} {tuple(state_pages.shape)}"
        )
    if num_seqs > 1 and state_pages.stride(0) != 1:  # the kernels read state_pages_ptr + s
        raise ValueError(f"state_pages must have unit stride; got {state_pages.stride(0)}")
    if state_pages.device != device:
        raise ValueError(f"state_pages is on {state_pages.device}; move it to {device}")


def _check_decode_inputs(q, k, v, g, beta) -> None:
    if q.dim() != 3 or k.shape != q.shape or v.dim() != 3 or v.shape[0] != q.shape[0]:
        raise ValueError(
            f"q and k must be [S, Hk, Dk] and v [S, Hv, Dv]; got q {tuple(q.shape)}, "
            f"k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    num_seqs, num_value_heads = v.shape[:2]
    if num_value_heads % k.shape[1]:
        raise ValueError(f"Hv ({num_value_heads}) must be a multiple of Hk ({k.shape[1]})")
    if k.shape[2] > _MAX_KEY_DIM:
        raise ValueError(f"Dk must be at most {_MAX_KEY_DIM}; got {k.shape[2]}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not t.dtype.is_floating_point or t.stride(2) != 1:
            raise ValueError(
                f"{name} must be a float tensor with unit last stride; got {t.dtype} "
                f"strides {t.stride()}"
            )
    for name, t in (("g", g), ("beta", beta)):
        if t.shape != (num_seqs, num_value_heads) or t.dtype != torch.float32:
            raise ValueError(
                f"{name} must be fp32 [S, Hv] = {[num_seqs, num_value_heads]}; got "
                f"{t.dtype} {tuple(t.shape)}"
            )
        if num_value_heads > 1 and t.stride(1) != 1:
            raise ValueError(f"{name} must have unit last stride; got strides {t.stride()}")
    for name, t in (("k", k), ("v", v), ("g", g), ("beta", beta)):
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device}; move it to {q.device}")


def gated_delta_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    states: torch.Tensor,
    state_pages: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    _check_decode_inputs(q, k, v, g, beta)
    num_seqs, num_value_heads, value_dim = v.shape
    key_dim = k.shape[2]
    check_state_view(states, (num_value_heads, key_dim, value_dim), torch.float32)
    if states.device != q.device:
        raise ValueError(f"states is on {states.device}; move it to {q.device}")
    check_state_pages(state_pages, num_seqs, q.device)
    o = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    if num_seqs == 0:
        return o
    scale = key_dim**-0.5 if scale is None else scale
    block_k = triton.next_power_of_2(key_dim)
    block_v = min(triton.next_power_of_2(value_dim), _STATE_TILE // block_k)
    grid = (num_seqs, num_value_heads, triton.cdiv(value_dim, block_v))
    _gated_delta_decode_kernel[grid](
        q, k, v, g, beta, states, state_pages, o, scale,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        g.stride(0), beta.stride(0), states.stride(0),
        GROUP=num_value_heads // k.shape[1], KEY_DIM=key_dim, VALUE_DIM=value_dim,
        BK=block_k, BV=block_v, num_warps=4,
    )  # fmt: skip
    return o


def gated_delta_decode_reference(
    q, k, v, g, beta, states, state_pages, scale: float | None = None
) -> torch.Tensor:
    """Torch loops over the rows, fp32 math; updates states in place like the kernel."""
    group = v.shape[1] // k.shape[1]
    scale = k.shape[2] ** -0.5 if scale is None else scale
    o = torch.zeros_like(v)
    for s, page in enumerate(state_pages.tolist()):
        if page < 0:
            continue
        qs, ks = (x[s].float().repeat_interleave(group, dim=0) for x in (q, k))  # [Hv, Dk]
        state = states[page] * g[s].exp()[:, None, None]  # [Hv, Dk, Dv]
        u = beta[s][:, None] * (v[s].float() - torch.einsum("hk,hkv->hv", ks, state))
        state = state + ks[:, :, None] * u[:, None, :]
        o[s] = torch.einsum("hk,hkv->hv", qs * scale, state).to(v.dtype)
        states[page] = state
    return o
