"""The kernels on a GPU: correctness at real shapes and timings against their floors, one run.

Usage (GPU):  python bench/kernels_gpu.py [--out-dir DIR] [--models all] [--tokens 1,...,4096]
              [--skip-attention]

Sections (each guarded, so one failure still leaves the others' figures):
  1. ceilings: device-to-device copy (bytes read + written) and an 8192^3 bf16 matmul.
  2. fused MoE per model: bf16 relative error of paged and contiguous outputs vs an fp32
     torch reference (outputs NaN-poisoned first), paged == contiguous bit for bit, then the
     whole op (align + 2 GEMMs + top-k sum) captured in a CUDA graph and timed with
     interleaved rounds (rimuru.kernels.moe_bench: 12 rounds x 25 replays, L2 flushed; the
     overhead is the median of the per-round paged/contiguous ratios, with its IQR); each
     against its floor max(FLOPs / 755e12, bytes / 4.17e12), where
     bytes = touched experts' weights + x + output.
  3. layer ops: the fused norms and RoPE against the torch path's ops in bf16 (values that
     differ, max |diff|), at Qwen3 and Mixtral shapes; the router top-k against the torch
     path (rows choosing other experts, max weight difference, µs each).
  4. attention: KV write (exact), prefill (chunked, GQA) error and a timing, decode error and
     bandwidth at batch 64 x 2k context for several context splits (CUDA-graph replays).
  5. hybrid states: Gated DeltaNet's decode kernel and chunked prefill (fla-core when
     installed: the `hybrid-cuda` extra), the short convolution's decode and prefill kernels,
     at Qwen3.5-35B-A3B's shapes (16 key / 32 value heads of 128, 8,192 conv channels, kernel
     4) in bf16 against the fp32 torch references, states read from and written to padded
     pool pages (max |diff| and relative error).
The last lines printed are the summary table; full figures go to DIR/kernels_gpu.json.
"""

import argparse
import functools
import json
import sys
import traceback
from pathlib import Path

import torch
import triton
import triton.testing

from rimuru.kernels import (
    fused_moe_contiguous,
    fused_moe_paged,
    fused_moe_reference,
    get_moe_config,
    paged_decode_attention,
    paged_decode_attention_reference,
    paged_prefill_attention,
    paged_prefill_attention_reference,
    write_kv_pages,
    write_kv_pages_reference,
)
from rimuru.kernels.moe_bench import (
    MODELS,
    PEAK_BYTES,
    PEAK_FLOPS,
    TOKEN_COUNTS,
    MoeShape,
    graph_of,
    interleaved_samples,
    make_experts,
    random_routing,
    run_info,
    summarize_ab,
)

DEVICE = torch.device("cuda")


def bench_ms(fn, rep: int = 100) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=rep, return_mode="median")


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref.float()).norm() / ref.float().norm())


def measure_ceilings() -> dict:
    n = 2**30  # 2 GiB of bf16 per side
    src = torch.randn(n, device=DEVICE, dtype=torch.bfloat16)
    copy_ms = bench_ms(functools.partial(torch.empty_like(src).copy_, src))
    del src
    m = torch.randn(8192, 8192, device=DEVICE, dtype=torch.bfloat16)
    k = torch.randn(8192, 8192, device=DEVICE, dtype=torch.bfloat16)
    mm_ms = bench_ms(lambda: m @ k)
    return {
        "copy_bytes_per_s": 2 * 2 * n / (copy_ms * 1e-3),
        "bf16_matmul_flops": 2 * 8192**3 / (mm_ms * 1e-3),
    }


def moe_floor_s(shape: MoeShape, num_tokens: int, touched: int) -> tuple[float, float]:
    inter, hidden, k = shape.inter_size, shape.hidden_size, shape.top_k
    flops = 2 * num_tokens * k * 3 * inter * hidden
    nbytes = 2 * (touched * 3 * inter * hidden + 2 * num_tokens * hidden)
    return flops / PEAK_FLOPS, nbytes / PEAK_BYTES


def check_moe(shape: MoeShape, experts, tokens: list[int]) -> list[dict]:
    rows = []
    for n in tokens:
        ids, weights = random_routing(n, shape, DEVICE, seed=1000 + n)
        x = torch.randn(n, shape.hidden_size, device=DEVICE).to(torch.bfloat16)
        poisoned = [torch.full_like(x, float("nan")) for _ in range(2)]
        paged = fused_moe_paged(
            x, ids, weights, experts.pool_pages, experts.buffer_pages, experts.expert_table,
            out=poisoned[0],
        )  # fmt: skip
        contig = fused_moe_contiguous(x, ids, weights, experts.w13, experts.w2, out=poisoned[1])
        ref = fused_moe_reference(x.float(), ids, weights, experts.w1, experts.w3, experts.w2)
        rows.append({
            "tokens": n,
            "paged_rel_err": rel_err(paged, ref),
            "contig_rel_err": rel_err(contig, ref),
            "all_finite": bool(paged.isfinite().all() and contig.isfinite().all()),
            "paged_equals_contig": bool(torch.equal(paged, contig)),
        })  # fmt: skip
    return rows


def time_moe(shape: MoeShape, experts, tokens: list[int]) -> list[dict]:
    rows = []
    for n in tokens:
        ids, weights = random_routing(n, shape, DEVICE, seed=n)
        x = torch.randn(n, shape.hidden_size, device=DEVICE).to(torch.bfloat16)
        config = get_moe_config(
            shape.num_experts, shape.inter_size, shape.hidden_size, n, shape.top_k, x.dtype, DEVICE
        )
        out_p, out_c = torch.empty_like(x), torch.empty_like(x)
        e = experts
        paged = graph_of(functools.partial(
            fused_moe_paged, x, ids, weights, e.pool_pages, e.buffer_pages, e.expert_table,
            config=config, out=out_p,
        ))  # fmt: skip
        contig = graph_of(functools.partial(
            fused_moe_contiguous, x, ids, weights, e.w13, e.w2, config=config, out=out_c
        ))  # fmt: skip
        ab = summarize_ab(*interleaved_samples(paged.replay, contig.replay, rounds=12, reps=25))
        touched = int(torch.unique(ids).numel())
        flop_s, byte_s = moe_floor_s(shape, n, touched)
        floor_us = max(flop_s, byte_s) * 1e6
        p_us, c_us = 1e6 * ab.a_s, 1e6 * ab.b_s
        rows.append({
            "tokens": n, "block_m": config.block_m, "paged_us": p_us, "contig_us": c_us,
            "overhead_pct": 100 * (ab.ratio - 1), "overhead_us": c_us * (ab.ratio - 1),
            "overhead_iqr_pct": [100 * (ab.ratio_q1 - 1), 100 * (ab.ratio_q3 - 1)],
            "floor_us": floor_us, "floor_bound": "flops" if flop_s > byte_s else "bytes",
            "contig_over_floor": c_us / floor_us, "paged_over_floor": p_us / floor_us,
        })  # fmt: skip
        print(f"  {shape.name:18s} T={n:5d} paged {p_us:9.1f} us  contig {c_us:9.1f} us  "
              f"{rows[-1]['overhead_pct']:+6.2f}% (IQR {rows[-1]['overhead_iqr_pct'][0]:+.2f}.."
              f"{rows[-1]['overhead_iqr_pct'][1]:+.2f})  floor {floor_us:8.1f} us "
              f"({rows[-1]['floor_bound']})  contig/floor {c_us / floor_us:5.2f}", flush=True)  # fmt: skip
        del paged, contig
    return rows


def kv_cache(num_pages: int, h_kv: int, dh: int, seed: int) -> torch.Tensor:
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    shape = (num_pages, 2, 16, h_kv, dh)
    return torch.randn(shape, generator=gen, device=DEVICE).to(torch.bfloat16)


def bench_attention(hq: int, h_kv: int, dh=128, batch=64, context=2048, prompt=1024) -> dict:
    result = {"hq": hq, "h_kv": h_kv, "dh": dh}
    # KV write, exact.
    kv = kv_cache(4096, h_kv, dh, seed=1)
    kv_ref = kv.clone()
    k = torch.randn(1000, h_kv, dh, device=DEVICE).to(torch.bfloat16)
    v = torch.randn_like(k)
    slots = torch.randperm(4096 * 16, device=DEVICE)[:1000]
    slots[::7] = -1
    write_kv_pages(k, v, kv, slots)
    write_kv_pages_reference(k, v, kv_ref, slots)
    result["kv_write_exact"] = bool(torch.equal(kv, kv_ref))
    # Chunked prefill: three sequences whose earlier chunks are already in the pool.
    q_lens, ctx = [100, 300, 1], [500, 300, 2048]
    cu = torch.tensor([0, 100, 400, 401], dtype=torch.int32, device=DEVICE)
    tables = torch.randperm(4096, device=DEVICE)[: 3 * 128].view(3, 128).int()
    q = torch.randn(sum(q_lens), hq, dh, device=DEVICE).to(torch.bfloat16)
    seq_lens = torch.tensor(ctx, dtype=torch.int32, device=DEVICE)
    out = torch.full_like(q, float("nan"))
    paged_prefill_attention(q, kv, tables, cu, seq_lens, max(q_lens), out=out)
    ref = paged_prefill_attention_reference(q, kv, tables, cu, seq_lens)
    result["prefill_rel_err"] = rel_err(out, ref)
    # Prefill timing: 4 fresh prompts (causal FLOPs counted once).
    cu4 = torch.arange(0, 5 * prompt, prompt, dtype=torch.int32, device=DEVICE)
    tables4 = torch.randperm(4096, device=DEVICE)[: 4 * prompt // 16].view(4, -1).int()
    q4 = torch.randn(4 * prompt, hq, dh, device=DEVICE).to(torch.bfloat16)
    lens4 = torch.full((4,), prompt, dtype=torch.int32, device=DEVICE)
    # Timed as CUDA-graph replays: host launch time (checks, allocations) stays out.
    prefill = graph_of(
        functools.partial(paged_prefill_attention, q4, kv, tables4, cu4, lens4, prompt)
    )
    ms = bench_ms(prefill.replay)
    flops = 4 * hq * 2 * 2 * dh * (prompt * (prompt + 1) / 2)
    result["prefill_4x1024_us"] = ms * 1e3
    result["prefill_tflops"] = flops / (ms * 1e-3) / 1e12
    del kv, kv_ref
    # Decode: batch 64 x 2048 context, pages scattered through a larger pool.
    B, L = batch, context
    kv = kv_cache(B * L // 16 + 2048, h_kv, dh, seed=2)
    tables = torch.randperm(kv.shape[0], device=DEVICE)[: B * L // 16].view(B, L // 16).int()
    q = torch.randn(B, hq, dh, device=DEVICE).to(torch.bfloat16)
    lens_rand = torch.randint(1, L + 1, (B,), dtype=torch.int32, device=DEVICE)
    out = torch.full_like(q, float("nan"))
    paged_decode_attention(q, kv, tables, lens_rand, L, out=out)
    result["decode_rel_err_random_lens"] = rel_err(
        out, paged_decode_attention_reference(q, kv, tables, lens_rand)
    )
    lens = torch.full((B,), L, dtype=torch.int32, device=DEVICE)
    nbytes = B * L * 2 * h_kv * dh * 2 + 2 * B * hq * dh * 2 + B * (L // 16) * 4
    result["decode_bytes"] = nbytes
    result["decode"] = {}
    for split in (None, 256, 512, 1024, 2048):
        out = torch.full_like(q, float("nan"))
        paged_decode_attention(q, kv, tables, lens, L, out=out, tokens_per_split=split)
        err = rel_err(out, paged_decode_attention_reference(q, kv, tables, lens))
        decode = graph_of(functools.partial(
            paged_decode_attention, q, kv, tables, lens, L, out=out, tokens_per_split=split
        ))  # fmt: skip
        ms = bench_ms(decode.replay)
        result["decode"][str(split)] = {
            "us": ms * 1e3,
            "bytes_per_s": nbytes / (ms * 1e-3),
            "rel_err": err,
        }
    return result


def check_layer_ops(tokens: int = 256) -> list[dict]:
    """The fused norms and RoPE against the torch path's ops, in bf16 on this GPU, at Qwen3
    and Mixtral shapes: how many outputs differ, and by how much (bf16 ulps near 1: 2^-7).
    The CPU tests cannot do this: the interpreter truncates bf16 casts."""
    from rimuru.dataplane.model.layers import rope_cos_sin, rope_inv_freq
    from rimuru.kernels import qk_norm_rope, qk_norm_rope_reference, rms_norm, rms_norm_reference

    rows = []
    g = torch.Generator(device=DEVICE).manual_seed(0)
    for name, hidden, hq, hkv, dh, qk_norm in (
        ("Qwen3-30B-A3B", 2048, 32, 4, 128, True), ("Mixtral-8x7B", 4096, 32, 8, 128, False),
    ):  # fmt: skip
        bf16 = dict(device=DEVICE, dtype=torch.bfloat16)
        x = torch.randn(tokens, hidden, generator=g, **bf16)
        r = torch.randn(tokens, hidden, generator=g, **bf16)
        w = 1 + 0.1 * torch.randn(hidden, generator=g, **bf16)
        y, res = rms_norm(x, w, 1e-6, residual=r)
        want_y, want_res = rms_norm_reference(x, w, 1e-6, residual=r)
        q = torch.randn(tokens, hq, dh, generator=g, **bf16)
        k = torch.randn(tokens, hkv, dh, generator=g, **bf16)
        pos = torch.randint(0, 8192, (tokens,), generator=g, device=DEVICE)
        cos, sin = rope_cos_sin(pos, rope_inv_freq(dh, 1e6, DEVICE), torch.bfloat16)
        wq, wk = (1 + 0.1 * torch.randn(2, dh, generator=g, **bf16)) if qk_norm else (None, None)
        got_q, got_k = qk_norm_rope(q, k, cos, sin, wq, wk, 1e-6)
        want_q, want_k = qk_norm_rope_reference(q, k, cos, sin, wq, wk, 1e-6)
        # fp32 truth: the torch ops on fp32 copies (cos/sin are bf16 in both paths)
        f32 = [t.float() if t is not None else None for t in (x, w, r, q, k, wq, wk)]
        true_y, true_res = rms_norm_reference(f32[0], f32[1], 1e-6, residual=f32[2])
        true_q, true_k = qk_norm_rope_reference(
            f32[3], f32[4], cos.float(), sin.float(), f32[5], f32[6], 1e-6
        )
        for op, got, want, true in (
            ("add_rms_norm", y, want_y, true_y), ("residual", res, want_res, true_res),
            ("qk_norm_rope q", got_q, want_q, true_q), ("qk_norm_rope k", got_k, want_k, true_k),
        ):  # fmt: skip
            diff = (got.float() - want.float()).abs()
            rows.append({
                "model": name, "op": op, "values": got.numel(),
                "differ": int((diff > 0).sum()), "max_abs_diff": float(diff.max()),
                "max_ulps_vs_torch": _max_ulps(got, want.float()),
                "kernel_max_ulps_vs_fp32": _max_ulps(got, true),
                "torch_max_ulps_vs_fp32": _max_ulps(want, true),
            })  # fmt: skip
    return rows


def check_router(tokens=(64, 256)) -> list[dict]:
    """The router top-k kernel against the model's torch path (layers.router_topk) on this
    GPU, bf16 router logits with the presets' skew bias: the rows whose chosen experts
    differ (only a tie at the k-th place may: torch breaks ties either way, and the tied
    experts weigh the same), the largest weight difference, and each side's time
    (CUDA-graph replays). Then the routing histogram of those ids (every fourth row a graph's
    padding row, added to a running total): equal to torch's, and each side's time."""
    from rimuru.dataplane.engine.experts.routing_histogram import routing_histogram_torch
    from rimuru.dataplane.model.layers import router_topk as torch_router_topk
    from rimuru.kernels import router_topk, routing_histogram
    from rimuru.kernels.moe_bench import replay_ms

    rows = []
    g = torch.Generator(device=DEVICE).manual_seed(0)
    for shape in (MODELS["qwen3-30b-a3b"], MODELS["qwen1.5-moe-a2.7b"]):
        E, K = shape.num_experts, shape.top_k
        bias = -torch.log1p(torch.randperm(E, generator=g, device=DEVICE).float())
        for n in tokens:
            logits = torch.randn(n, E, generator=g, device=DEVICE).to(torch.bfloat16)
            args = (logits, bias, K, True)
            ids, w = router_topk(*args)
            want_ids, want_w = torch_router_topk(*args)
            real = (torch.arange(n, device=DEVICE) % 4 != 3).long()
            total = torch.zeros(E, dtype=torch.int64, device=DEVICE)
            hist = (ids, E, real, total)
            rows.append({
                "model": shape.name, "tokens": n,
                # bf16 logits tie; torch orders equal ones either way: compare chosen sets
                "rows_differ": int((ids.sort(1).values != want_ids.sort(1).values).any(1).sum()),
                "max_weight_diff": float((w - want_w).abs().max()),
                "kernel_us": 1e3 * replay_ms(functools.partial(router_topk, *args), 10),
                "torch_us": 1e3 * replay_ms(functools.partial(torch_router_topk, *args), 10),
                "histogram_equal": bool(torch.equal(
                    routing_histogram(*hist), routing_histogram_torch(ids, E, real)
                )),
                "histogram_us": 1e3 * replay_ms(functools.partial(routing_histogram, *hist), 10),
                "histogram_torch_us": 1e3
                * replay_ms(functools.partial(routing_histogram_torch, *hist), 10),
            })  # fmt: skip
    return rows


def _pages(num_pages: int, shape: tuple[int, ...], dtype, pad: int) -> torch.Tensor:
    """A [P, *shape] view whose page stride exceeds the page (a padded pool slot)."""
    size = 1
    for d in shape:
        size *= d
    slots = torch.randn(num_pages, size + pad, device="cuda").to(dtype)
    return slots[:, :size].view(num_pages, *shape)


def _err(got: torch.Tensor, want: torch.Tensor) -> str:
    d = (got.float() - want.float()).abs()
    return f"max abs {d.max().item():.2e}, rel {(d.norm() / want.float().norm()).item():.2e}"


def check_hybrid_states() -> list[tuple[str, str]]:
    """Gated DeltaNet's state kernels at Qwen3.5-35B-A3B's shapes in bf16 against the fp32
    torch references, states in padded pool slots (rows of (what, error))."""
    from rimuru.dataplane.engine.forward.paged_states import StepPart, _fla_chunk_prefill
    from rimuru.dataplane.model import gated_delta, preset_config
    from rimuru.dataplane.model.hybrid.causal_conv import causal_conv1d
    from rimuru.kernels import causal_conv_decode, causal_conv_prefill, gated_delta_decode

    gdn = preset_config("qwen3.5-35b-a3b").linear_attention
    hk, hv, dk, dv = gdn.num_key_heads, gdn.num_value_heads, gdn.key_head_dim, gdn.value_head_dim
    cc, kernel = gdn.conv_dim, gdn.conv_kernel_size
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []

    def inputs(t: int):
        q = torch.nn.functional.normalize(
            torch.randn(t, hk, dk, device="cuda", generator=gen), dim=-1
        )
        k = torch.nn.functional.normalize(
            torch.randn(t, hk, dk, device="cuda", generator=gen), dim=-1
        )
        v = torch.randn(t, hv, dv, device="cuda", generator=gen).bfloat16()
        g = -torch.rand(t, hv, device="cuda", generator=gen) * 0.5
        beta = torch.rand(t, hv, device="cuda", generator=gen)
        return q, k, v, g, beta

    # gated delta rule, decode: 64 sequences, one token each, pages 0, 2, 4, ...
    states = _pages(160, (hv, dk, dv), torch.float32, pad=4096) * 0.1
    pages = torch.arange(0, 128, 2, device="cuda")
    q, k, v, g, beta = inputs(64)
    before = states[pages].clone()
    out = gated_delta_decode(q, k, v, g, beta, states, pages)
    want_o, want_s = [], []
    for i in range(64):
        r = slice(i, i + 1)
        o, s = gated_delta.recurrent(q[r], k[r], v[r].float(), g[r], beta[r], before[i].clone())
        want_o.append(o)
        want_s.append(s)
    rows.append(("gdn decode out (bf16 v)", _err(out, torch.cat(want_o))))
    rows.append(("gdn decode state", _err(states[pages], torch.stack(want_s))))
    # chunked prefill of varlen sequences from nonzero states
    prefill = _fla_chunk_prefill()
    lengths = [300, 17, 1, 64, 130]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda")
    q, k, v, g, beta = inputs(sum(lengths))
    pages = torch.tensor([3, 9, 1, 50, 7], device="cuda")
    before = states[pages].clone()
    if prefill is None:
        rows.append(("gdn chunked prefill", "fla-core not installed: torch path"))
    else:
        part = StepPart(None, pages[None], pages[None], cu.to(torch.int32), cu, cu.cpu())
        out = prefill(q, k, v, g, beta, states, pages, part)
        outs, finals = [], []
        for i, n in enumerate(lengths):
            r = slice(int(cu[i]), int(cu[i]) + n)
            o, s = gated_delta.chunked(q[r], k[r], v[r].float(), g[r], beta[r], before[i].clone())
            outs.append(o)
            finals.append(s)
        rows.append(("gdn prefill out (fla, bf16)", _err(out, torch.cat(outs))))
        rows.append(("gdn prefill state (fla)", _err(states[pages], torch.stack(finals))))
    # conv: decode then prefill
    weight = torch.randn(cc, kernel, device="cuda", generator=gen).bfloat16() * 0.3
    conv = _pages(80, (cc, kernel - 1), torch.bfloat16, pad=1024)
    pages = torch.arange(1, 65, device="cuda")
    x = torch.randn(64, cc, device="cuda", generator=gen).bfloat16()
    before = conv[pages].clone()
    out = causal_conv_decode(x, weight, conv, pages)
    want = [
        causal_conv1d(x[i : i + 1].float(), weight.float(), before[i].float()) for i in range(64)
    ]
    rows.append(("conv decode out", _err(out, torch.cat([w[0] for w in want]))))
    rows.append(("conv decode state", _err(conv[pages], torch.stack([w[1] for w in want]))))
    x = torch.randn(sum(lengths), cc, device="cuda", generator=gen).bfloat16()
    pages = torch.tensor([3, 9, 1, 50, 7], device="cuda")
    before = conv[pages].clone()
    out = causal_conv_prefill(x, weight, conv, pages, cu.to(torch.int32))
    want = [
        causal_conv1d(x[int(cu[i]) : int(cu[i + 1])].float(), weight.float(), before[i].float())
        for i in range(len(lengths))
    ]
    rows.append(("conv prefill out", _err(out, torch.cat([w[0] for w in want]))))
    rows.append(("conv prefill state", _err(conv[pages], torch.stack([w[1] for w in want]))))
    return rows


def _max_ulps(got: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest |got - ref| in bf16 ulps of ref (ulp of |v| in [2^e, 2^(e+1)) = 2^(e-7)),
    counted at |ref| >= 1/8 for smaller refs: RoPE's q*cos - rot*sin cancels to near 0,
    where an absolute error of the inputs' size would read as millions of ulps."""
    ulp = torch.exp2(torch.floor(torch.log2(ref.abs().clamp_min(0.125))) - 7)
    return float(((got.float() - ref).abs() / ulp).max())


def _passed(report: dict, key: str, label: str):
    """The rows of report[key] that ran; a row that raised is printed as FAILED."""
    for row in report.get(key, []):
        if "error" in row:
            print(f"{label}: FAILED {row['error']}")
        else:
            yield row


def summarize(report: dict) -> None:
    print(f"\n==== summary ({report.get('device', 'GPU')}, bf16) ====")
    c = report.get("ceilings")
    if c:
        print(f"ceilings measured: copy {c['copy_bytes_per_s'] / 1e12:.2f} TB/s, "
              f"bf16 matmul {c['bf16_matmul_flops'] / 1e12:.0f} TFLOP/s "
              f"(floors use {PEAK_BYTES / 1e12} TB/s, {PEAK_FLOPS / 1e12:.0f} TFLOP/s)")  # fmt: skip
    for name, m in report.get("moe", {}).items():
        if "error" in m:
            print(f"{name}: FAILED {m['error']}")
            continue
        errs = ", ".join(f"T={r['tokens']}: {r['paged_rel_err']:.1e}" for r in m["check"])
        same = all(r["paged_equals_contig"] and r["all_finite"] for r in m["check"])
        print(f"{name}: bf16 rel err {errs}; paged==contig and finite: {same}")
        print(
            f"{'T':>6} {'paged us':>10} {'contig us':>10} {'ovh %':>7} {'IQR %':>13} {'ovh us':>7} {'floor us':>9} {'c/floor':>7}"
        )
        for r in m["timing"]:
            print(f"{r['tokens']:6d} {r['paged_us']:10.1f} {r['contig_us']:10.1f} {r['overhead_pct']:+7.2f} "
                  f"{r['overhead_iqr_pct'][0]:+6.2f}..{r['overhead_iqr_pct'][1]:+5.2f} "
                  f"{r['overhead_us']:+7.2f} {r['floor_us']:9.1f} {r['contig_over_floor']:7.2f}")  # fmt: skip
        big = [r for r in m["timing"] if r["tokens"] >= 1024]
        one = [r for r in m["timing"] if r["tokens"] == 1]
        if big:
            print(f"  >=1024 tokens: mean overhead {sum(r['overhead_pct'] for r in big) / len(big):+.2f}% "
                  f"(target <= +0.5%), max contig/floor {max(r['contig_over_floor'] for r in big):.2f} (target <= 1.5)")  # fmt: skip
        if one:
            print(f"  1 token: overhead {one[0]['overhead_us']:+.2f} us (target <= +2 us)")
    for r in _passed(report, "layer_ops", "layer ops"):
        print(f"layer ops {r['model']} {r['op']}: {r['differ']} of {r['values']} bf16 values differ "
              f"(max {r['max_ulps_vs_torch']:.1f} ulp; vs fp32: kernel {r['kernel_max_ulps_vs_fp32']:.2f}, "
              f"torch {r['torch_max_ulps_vs_fp32']:.2f} ulp) "
              f"from torch, max |diff| {r['max_abs_diff']:.2e}")  # fmt: skip
    for r in _passed(report, "router", "router top-k"):
        print(f"router top-k {r['model']} T={r['tokens']}: {r['rows_differ']} rows choose other "
              f"experts than torch, max |dw| {r['max_weight_diff']:.1e}; {r['kernel_us']:.1f} us "
              f"vs torch {r['torch_us']:.1f} us")  # fmt: skip
        print(f"  routing histogram: equal to torch {r['histogram_equal']}; "
              f"{r['histogram_us']:.1f} us vs torch {r['histogram_torch_us']:.1f} us")  # fmt: skip
    for a in _passed(report, "attention", "attention"):
        best = min(a["decode"].items(), key=lambda kv: kv[1]["us"])
        dflt = a["decode"]["None"]
        print(f"attention Hq={a['hq']} Hkv={a['h_kv']}: kv_write exact {a['kv_write_exact']}; prefill err "
              f"{a['prefill_rel_err']:.1e}, 4x1024 {a['prefill_4x1024_us']:.0f} us ({a['prefill_tflops']:.0f} TFLOP/s); "
              f"decode err {a['decode_rel_err_random_lens']:.1e}")  # fmt: skip
        print(f"  decode 64x2048: default split {dflt['us']:.1f} us = {dflt['bytes_per_s'] / 1e12:.2f} TB/s "
              f"({100 * dflt['bytes_per_s'] / PEAK_BYTES:.0f}% of 4.17); best split {best[0]}: "
              f"{best[1]['us']:.1f} us = {100 * best[1]['bytes_per_s'] / PEAK_BYTES:.0f}% (target >= 70%)")  # fmt: skip
    for what, error in report.get("hybrid", []):
        print(f"hybrid {what}: {error}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=Path("."))
    parser.add_argument("--models", default="all", help="comma list, 'all' or 'none'")
    parser.add_argument("--tokens", default=",".join(map(str, TOKEN_COUNTS)))
    parser.add_argument("--check-tokens", default="1,7,64,1024")
    parser.add_argument("--skip-attention", action="store_true", help="fused MoE only")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("kernels_gpu.py needs a CUDA GPU", file=sys.stderr)
        return 2
    names = {"all": sorted(MODELS), "none": []}.get(args.models) or args.models.split(",")
    tokens = [int(t) for t in args.tokens.split(",")]
    report = {
        **run_info(),
        "moe": {},
        "attention": [],
    }
    try:
        report["ceilings"] = measure_ceilings()
    except Exception:
        traceback.print_exc()
    for name in names:
        shape = MODELS[name]
        try:
            experts = make_experts(shape, torch.bfloat16, DEVICE, seed=0)
            check = check_moe(shape, experts, [int(t) for t in args.check_tokens.split(",")])
            print(f"{shape.name}: check {check}", flush=True)
            report["moe"][name] = {"check": check, "timing": time_moe(shape, experts, tokens)}
            del experts
            torch.cuda.empty_cache()
        except Exception as exc:
            traceback.print_exc()
            report["moe"][name] = {"error": repr(exc)[:300]}
    try:
        report["layer_ops"] = check_layer_ops()
    except Exception as exc:
        traceback.print_exc()
        report["layer_ops"] = [{"error": repr(exc)[:300]}]
    try:
        report["router"] = check_router()
    except Exception as exc:
        traceback.print_exc()
        report["router"] = [{"error": repr(exc)[:300]}]
    for hq, h_kv in () if args.skip_attention else ((32, 4), (16, 16)):
        try:
            report["attention"].append(bench_attention(hq, h_kv))
        except Exception as exc:
            traceback.print_exc()
            report["attention"].append({"error": repr(exc)[:300]})
    try:
        report["hybrid"] = check_hybrid_states()
    except Exception as exc:
        traceback.print_exc()
        report["hybrid"] = [("hybrid states", f"FAILED {exc!r}"[:300])]
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "kernels_gpu.json").write_text(json.dumps(report, indent=1) + "\n")
    summarize(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
