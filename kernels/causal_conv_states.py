"""Gated DeltaNet's short causal convolution (depthwise, kernel K, then SiLU) with each
sequence's convolution state in its page of the pool.

Shape key: S = sequences, T = new tokens of all sequences, P = state pages, C = channels,
K = kernel, BT/BC = token/channel tile sizes.

    causal_conv_decode(x [S, C], weight [C, K], states [P, C, K-1],
                       state_pages [S] int32 | int64) -> out [S, C]
    causal_conv_prefill(x [T, C], weight [C, K], states [P, C, K-1],
                        state_pages [S] int32 | int64, cu_seqlens [S+1] int32) -> out [T, C]

A sequence's state is its last K - 1 inputs (zeros before its first token: the caller
zeroes a new sequence's page), kept in x's dtype. Token t of channel c, with the state
standing before the sequence's first new token, gives

    out[t, c] = silu( sum_j weight[c, j] · x[t - (K - 1) + j, c] )

and afterwards the page holds the sequence's last K - 1 inputs: old state and new tokens
mixed when fewer than K - 1 tokens came. Decode has one token per sequence; prefill's
sequence s owns rows cu_seqlens[s] .. cu_seqlens[s+1] - 1 of x (at least one each, and
cu_seqlens[S] = T: not checked, that would synchronise with the host). A page id < 0 marks a
padding sequence: its rows of out are zeros and no page is written. The page ids of the
other sequences must be distinct and < P.

The numerics are the torch path's (dataplane/model/hybrid/causal_conv.py): the sum in fp32, rounded
to x's dtype (F.conv1d's output), then SiLU in fp32 rounded again.

states is the pool's view of its pages: each page's [C, K-1] is contiguous but the page
stride may exceed C·(K-1) (a page padded to the pool's slot).
"""

import torch
import triton
import triton.language as tl

from rimuru.kernels.gated_delta_decode import check_state_pages, check_state_view

_BLOCK_C_DECODE = 256
_BLOCK_C_PREFILL = 128
_BLOCK_T_PREFILL = 16  # with 2 warps: the fastest tile timed at C = 8192


@triton.jit
def _silu_as_torch(acc, dtype: tl.constexpr):
    """silu of the fp32 sum as torch computes it on F.conv1d's output rounded to dtype."""
    acc = acc.to(dtype).to(tl.float32)
    return (acc * tl.sigmoid(acc)).to(dtype)


# A layer's page ids may be a row view of a [L, S] table: their alignment is not specialised.
@triton.jit(do_not_specialize_on_alignment=["state_pages_ptr"])
def _conv_decode_kernel(
    x_ptr,
    weight_ptr,
    states_ptr,
    state_pages_ptr,
    out_ptr,  # [S, C] contiguous
    stride_xs,
    stride_wc,
    stride_wk,
    stride_page,
    CHANNELS: tl.constexpr,
    KERNEL: tl.constexpr,
    BC: tl.constexpr,
    BW: tl.constexpr,  # next power of two >= K
):
    s = tl.program_id(0)
    c = tl.program_id(1) * BC + tl.arange(0, BC)
    cmask = c < CHANNELS
    out_ptrs = out_ptr + s * CHANNELS + c
    page = tl.load(state_pages_ptr + s).to(tl.int64)
    if page < 0:
        tl.store(out_ptrs, tl.zeros((BC,), dtype=out_ptr.dtype.element_ty), mask=cmask)
        return
    j = tl.arange(0, BW)
    state_ptrs = states_ptr + page * stride_page + c[:, None] * (KERNEL - 1) + j[None, :]
    in_state = cmask[:, None] & (j < KERNEL - 1)[None, :]
    history = tl.load(state_ptrs, mask=in_state, other=0.0)  # [BC, BW]
    x = tl.load(x_ptr + s * stride_xs + c, mask=cmask, other=0.0)
    window = tl.where((j == KERNEL - 1)[None, :], x[:, None], history)  # (state, x)
    weight = tl.load(
        weight_ptr + c[:, None] * stride_wc + j[None, :] * stride_wk,
        mask=cmask[:, None] & (j < KERNEL)[None, :],
        other=0.0,
    )
    acc = tl.sum(window.to(tl.float32) * weight.to(tl.float32), axis=1)
    # The new state is the window shifted left by one: another thread's element may land
    # on a column this one has yet to read, so every read finishes before the first write.
    tl.debug_barrier()
    tl.store(state_ptrs - 1, window, mask=cmask[:, None] & ((j >= 1) & (j < KERNEL))[None, :])
    tl.store(out_ptrs, _silu_as_torch(acc, out_ptr.dtype.element_ty), mask=cmask)


@triton.jit(
    do_not_specialize=["num_tokens", "num_search_steps"],
    do_not_specialize_on_alignment=["state_pages_ptr", "cu_seqlens_ptr"],
)
def _conv_prefill_out_kernel(
    x_ptr,
    weight_ptr,
    states_ptr,
    state_pages_ptr,
    cu_seqlens_ptr,
    out_ptr,  # [T, C] contiguous
    num_tokens,
    num_seqs,
    num_search_steps,  # >= ceil(log2(num_seqs))
    stride_xt,
    stride_wc,
    stride_wk,
    stride_page,
    CHANNELS: tl.constexpr,
    KERNEL: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
):
    t = tl.program_id(0) * BT + tl.arange(0, BT)
    c = tl.program_id(1) * BC + tl.arange(0, BC)
    tmask = t < num_tokens
    cmask = c < CHANNELS
    # Each row's sequence: the last s with cu_seqlens[s] <= t (binary search, cu[lo] <= t < cu[hi]).
    lo = tl.zeros((BT,), dtype=tl.int32)
    hi = tl.full((BT,), num_seqs, dtype=tl.int32)
    for _ in range(num_search_steps):
        mid = (lo + hi) // 2
        right = tl.load(cu_seqlens_ptr + mid) <= t
        lo = tl.where(right, mid, lo)
        hi = tl.where(right, hi, mid)
    start = tl.load(cu_seqlens_ptr + lo)
    page = tl.load(state_pages_ptr + lo).to(tl.int64)
    live = tmask & (page >= 0)
    acc = tl.zeros((BT, BC), dtype=tl.float32)
    for j in tl.static_range(KERNEL):  # the inputs among the new tokens
        src = t - (KERNEL - 1) + j
        from_x = (live & (src >= start))[:, None] & cmask[None, :]
        x = tl.load(
            x_ptr + src.to(tl.int64)[:, None] * stride_xt + c[None, :], mask=from_x, other=0.0
        )
        weight = tl.load(weight_ptr + c * stride_wc + j * stride_wk, mask=cmask, other=0.0)
        acc += x.to(tl.float32) * weight.to(tl.float32)[None, :]
    # The inputs before a sequence's first new token, in its state: only a tile holding one
    # of a sequence's first K - 1 rows reads any. Keep it a branch: most tiles skip it, and a
    # branch-free loop for these taps made the loop above twice as slow when timed.
    if tl.min(tl.where(live, t - start, KERNEL), axis=0) < KERNEL - 1:
        for j in tl.static_range(KERNEL - 1):
            src = t - (KERNEL - 1) + j
            from_state = (live & (src < start))[:, None] & cmask[None, :]
            held_ptrs = (
                states_ptr
                + page[:, None] * stride_page
                + c[None, :] * (KERNEL - 1)
                + (KERNEL - 1 + src - start)[:, None]
            )
            held = tl.load(held_ptrs, mask=from_state, other=0.0)
            weight = tl.load(weight_ptr + c * stride_wc + j * stride_wk, mask=cmask, other=0.0)
            acc += held.to(tl.float32) * weight.to(tl.float32)[None, :]
    out = _silu_as_torch(acc, out_ptr.dtype.element_ty)  # padding rows: silu(0) = 0
    out_ptrs = out_ptr + t.to(tl.int64)[:, None] * CHANNELS + c[None, :]
    tl.store(out_ptrs, out, mask=tmask[:, None] & cmask[None, :])


@triton.jit(do_not_specialize_on_alignment=["state_pages_ptr", "cu_seqlens_ptr"])
def _conv_prefill_state_kernel(
    x_ptr,
    states_ptr,
    state_pages_ptr,
    cu_seqlens_ptr,
    stride_xt,
    stride_page,
    CHANNELS: tl.constexpr,
    KERNEL: tl.constexpr,
    BC: tl.constexpr,
    BW: tl.constexpr,  # next power of two >= K - 1
):
    s = tl.program_id(0)
    page = tl.load(state_pages_ptr + s).to(tl.int64)
    if page < 0:
        return
    c = tl.program_id(1) * BC + tl.arange(0, BC)
    cmask = c < CHANNELS
    start = tl.load(cu_seqlens_ptr + s)
    end = tl.load(cu_seqlens_ptr + s + 1)
    i = tl.arange(0, BW)
    src = end - (KERNEL - 1) + i  # the input row of new state column i
    in_state = i < KERNEL - 1
    state_ptrs = states_ptr + page * stride_page + c[:, None] * (KERNEL - 1) + i[None, :]
    x = tl.load(
        x_ptr + src.to(tl.int64)[None, :] * stride_xt + c[:, None],
        mask=cmask[:, None] & (in_state & (src >= start))[None, :],
        other=0.0,
    )
    held = tl.load(  # old column i + (end - start), kept when the chunk is shorter than K - 1
        state_ptrs + (end - start),
        mask=cmask[:, None] & (in_state & (src < start))[None, :],
        other=0.0,
    )
    # Columns move left by the chunk's length: every read finishes before the first write.
    tl.debug_barrier()
    tl.store(
        state_ptrs,
        tl.where((src >= start)[None, :], x, held),
        mask=cmask[:, None] & in_state[None, :],
    )


def _check_conv_inputs(x: torch.Tensor, weight: torch.Tensor, states: torch.Tensor) -> None:
    if weight.dim() != 2 or weight.shape[1] < 2 or not weight.dtype.is_floating_point:
        raise ValueError(
            f"weight must be a float [C, K] with K >= 2; got {weight.dtype} {tuple(weight.shape)}"
        )
    channels, kernel = weight.shape
    if x.dim() != 2 or x.shape[1] != channels or not x.dtype.is_floating_point:
        raise ValueError(f"x must be a float [rows, C={channels}]; got {x.dtype} {tuple(x.shape)}")
    if channels > 1 and x.stride(1) != 1:
        raise ValueError(f"x must have unit channel stride; got strides {x.stride()}")
    check_state_view(states, (channels, kernel - 1), x.dtype)
    for name, t in (("weight", weight), ("states", states)):
        if t.device != x.device:
            raise ValueError(f"{name} is on {t.device}; move it to {x.device}")


def causal_conv_decode(
    x: torch.Tensor, weight: torch.Tensor, states: torch.Tensor, state_pages: torch.Tensor
) -> torch.Tensor:
    _check_conv_inputs(x, weight, states)
    num_seqs, channels = x.shape
    check_state_pages(state_pages, num_seqs, x.device)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if num_seqs == 0:
        return out
    block_c = min(_BLOCK_C_DECODE, triton.next_power_of_2(channels))
    kernel = weight.shape[1]
    _conv_decode_kernel[(num_seqs, triton.cdiv(channels, block_c))](
        x, weight, states, state_pages, out,
        x.stride(0), weight.stride(0), weight.stride(1), states.stride(0),
        CHANNELS=channels, KERNEL=kernel, BC=block_c, BW=triton.next_power_of_2(kernel),
    )  # fmt: skip
    return out


def causal_conv_prefill(
    x: torch.Tensor,
    weight: torch.Tensor,
    states: torch.Tensor,
    state_pages: torch.Tensor,
    cu_seqlens: torch.Tensor,
) -> torch.Tensor:
    _check_conv_inputs(x, weight, states)
    num_tokens, channels = x.shape
    if cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 1 or cu_seqlens.dtype != torch.int32:
        raise ValueError(
            f"cu_seqlens must be int32 [S+1]; got {cu_seqlens.dtype} {tuple(cu_seqlens.shape)}"
        )
    num_seqs = cu_seqlens.shape[0] - 1
    if (num_seqs > 0 and cu_seqlens.stride(0) != 1) or cu_seqlens.device != x.device:
        raise ValueError(f"cu_seqlens must have unit stride and be on {x.device}")
    check_state_pages(state_pages, num_seqs, x.device)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if num_seqs == 0 or num_tokens == 0:
        return out
    kernel = weight.shape[1]
    block_c = min(_BLOCK_C_PREFILL, triton.next_power_of_2(channels))
    channel_blocks = triton.cdiv(channels, block_c)
    # Every output reads the initial states before any is overwritten: the state update is a
    # second launch, after the first on the stream (one launch could not order a sequence's
    # first rows, read by one program, before its state's write by another).
    _conv_prefill_out_kernel[(triton.cdiv(num_tokens, _BLOCK_T_PREFILL), channel_blocks)](
        x, weight, states, state_pages, cu_seqlens, out,
        num_tokens, num_seqs, num_seqs.bit_length(),
        x.stride(0), weight.stride(0), weight.stride(1), states.stride(0),
        CHANNELS=channels, KERNEL=kernel, BT=_BLOCK_T_PREFILL, BC=block_c, num_warps=2,
    )  # fmt: skip
    _conv_prefill_state_kernel[(num_seqs, channel_blocks)](
        x, states, state_pages, cu_seqlens, x.stride(0), states.stride(0),
        CHANNELS=channels, KERNEL=kernel, BC=block_c, BW=triton.next_power_of_2(kernel - 1),
    )  # fmt: skip
    return out


def _conv_sequence_reference(x, weight, state) -> tuple[torch.Tensor, torch.Tensor]:
    """(out [n, C], next state [C, K-1]) of one sequence's rows x [n, C] after state."""
    kernel = weight.shape[1]
    padded = torch.cat((state, x.t()), dim=1)  # [C, K - 1 + n]
    windows = padded.unfold(1, kernel, 1).float()  # [C, n, K]
    acc = (windows * weight.float()[:, None, :]).sum(-1).to(x.dtype).float()  # [C, n]
    out = (acc * torch.sigmoid(acc)).to(x.dtype).t()
    return out, padded[:, padded.shape[1] - (kernel - 1) :]


def causal_conv_prefill_reference(x, weight, states, state_pages, cu_seqlens) -> torch.Tensor:
    """Torch loops over the sequences; updates states in place like the kernels."""
    out = torch.zeros_like(x)
    bounds = cu_seqlens.tolist()
    for s, page in enumerate(state_pages.tolist()):
        if page >= 0:
            rows = slice(bounds[s], bounds[s + 1])
            out[rows], states[page] = _conv_sequence_reference(x[rows], weight, states[page])
    return out


def causal_conv_decode_reference(x, weight, states, state_pages) -> torch.Tensor:
    cu_seqlens = torch.arange(x.shape[0] + 1, dtype=torch.int32)
    return causal_conv_prefill_reference(x, weight, states, state_pages, cu_seqlens)
