"""The start-up warm-up: every MoE kernel variant a step can launch is among its batches,
each batch stays within the scheduler's limits, the decode contexts reach every split
variant, and every batch goes through the Triton forward (under the interpreter, in a
subprocess: this folder imports triton without it)."""

import os
import subprocess
import sys

import torch
import triton

from rimuru.dataplane.engine.forward.profile_run import ScratchSeq
from rimuru.dataplane.engine.startup.warmup import warmup_batches
from rimuru.kernels import decode_warmup_contexts, fused_moe_variant
from rimuru.kernels.moe_configs import GemmTile, MoeConfig
from rimuru.kernels.paged_decode import _default_split

CPU = torch.device("cpu")


def qwen3_key(num_tokens: int):  # the real key, CPU configs (default_moe_config)
    return fused_moe_variant(num_tokens, 8, 128, 768, 2048, torch.bfloat16, CPU)


def test_small_plan_is_exactly_decodes_per_key_then_contexts_prompt_and_a_mixed_step():
    got = warmup_batches(16, 4, 1024, 16, lambda t: t.bit_length(), [1, 512])
    decode = ScratchSeq(1, 15)
    assert got == [
        (decode,), (decode, decode), (decode,) * 4,  # keys of 1, 2-3, 4-7 tokens
        (ScratchSeq(8, 0),), (ScratchSeq(16, 0),),  # 8-15, 16: more tokens than sequences
        (ScratchSeq(1, 511),),  # a split decode
        (ScratchSeq(15, 15), decode),  # a second chunk beside a decode
    ]  # fmt: skip


def test_every_moe_key_of_every_step_size_is_warmed_up():
    for tokens, seqs, model_len in ((2048, 256, 40960), (8192, 256, 1024), (600, 3, 4096)):
        batches = warmup_batches(tokens, seqs, model_len, 16, qwen3_key, [1])
        warmed = {qwen3_key(sum(s.num_new_tokens for s in b)) for b in batches}
        serving = {qwen3_key(t) for t in range(1, tokens + 1)}
        assert serving <= warmed, (tokens, seqs, model_len)
        for batch in batches:  # and every batch is one the scheduler could form
            assert len(batch) <= seqs
            assert sum(s.num_new_tokens for s in batch) <= tokens
            assert all(s.num_computed_tokens + s.num_new_tokens <= model_len for s in batch)


def test_a_tuned_table_bucket_change_between_powers_of_two_is_covered():
    # nearest-bucket configs switch at 48 and 96 tokens, not at powers of two
    small, mid, big = (MoeConfig(bm, GemmTile(64, 64), GemmTile(64, 64)) for bm in (16, 32, 64))

    def key(t: int):
        return (small if t <= 48 else mid if t <= 96 else big), triton.next_power_of_2(t)

    batches = warmup_batches(128, 256, 4096, 16, key, [1])
    sizes = {sum(s.num_new_tokens for s in b) for b in batches}
    assert {1, 2, 3, 5, 9, 17, 33, 49, 65, 97} <= sizes


def test_decode_contexts_reach_every_split_padding():
    contexts = decode_warmup_contexts(h_kv=1, max_model_len=4096, device=CPU)
    assert contexts == [1, 512, 1024, 2048]  # the CPU sizing: 8 programs, so at most 8 splits
    pads = {triton.next_power_of_2(triton.cdiv(c, _default_split(1, 1, c, CPU))) for c in contexts}
    reachable = {
        triton.next_power_of_2(triton.cdiv(n, _default_split(b, 1, n, CPU)))
        for b in (1, 2, 3, 8)
        for n in range(1, 4097, 7)
    }
    assert reachable <= pads
    assert decode_warmup_contexts(h_kv=1, max_model_len=600, device=CPU) == [1, 512]


_TRITON_RUN = """
from rimuru.dataplane.engine.startup.config import EngineConfig
from rimuru.dataplane.engine.engine import Engine
from rimuru.dataplane.engine.startup.warmup import warm_up, warmup_batches
from rimuru.kernels import fused_moe_variant

engine = Engine(EngineConfig(use_kernels=True, activation_reserve=0), log_plan=False)
mc = engine.model_config
def key(t):
    return fused_moe_variant(t, mc.top_k, mc.num_experts, mc.moe_intermediate_size,
                             mc.hidden_size, engine.dtype, engine.device)
batches = warmup_batches(16, 4, 600, 16, key, [1, 512])
seconds = warm_up(engine.model, engine.host_experts, engine.geometry, batches,
                  engine.paths.moe_kernel(), engine.paths.attention_kernels())
print("ran", len(batches), seconds > 0)
"""


def test_every_batch_runs_through_the_triton_forward():
    done = subprocess.run(
        [sys.executable, "-c", _TRITON_RUN],
        env=dict(os.environ, TRITON_INTERPRET="1"), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    ran, count, positive = done.stdout.split()
    assert (ran, positive) == ("ran", "True") and int(count) >= 4
