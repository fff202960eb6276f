"""The start-up warm-up: which batch shapes it runs, that each stays within the scheduler's
limits, and that every one of them goes through the Triton forward (under the interpreter,
in a subprocess: this folder imports triton without it)."""

import os
import subprocess
import sys

from rimuru.dataplane.engine.warmup import WarmupSeq, warmup_batches


def test_batches_cover_token_buckets_split_counts_prefill_and_a_mixed_step():
    got = warmup_batches(max_num_batched_tokens=16, max_num_seqs=4, max_model_len=64, block_size=16)
    decode = WarmupSeq(1, 15)
    assert got == [
        (decode,),
        (decode, decode),
        (decode,) * 4,  # 1, 2, 4 sequences of one token
        (WarmupSeq(1, 31),),
        (WarmupSeq(1, 63),),  # contexts of 32 and 64 tokens
        (WarmupSeq(2, 0),), (WarmupSeq(4, 0),), (WarmupSeq(8, 0),), (WarmupSeq(16, 0),),
        (WarmupSeq(15, 15), decode),  # a second chunk beside a decode
    ]  # fmt: skip


def test_every_batch_stays_within_the_scheduler_limits():
    for tokens, seqs, model_len in ((2048, 256, 32768), (1024, 256, 4096), (100, 3, 50), (8, 1, 8)):
        batches = warmup_batches(tokens, seqs, model_len, 16)
        assert batches, (tokens, seqs, model_len)
        for batch in batches:
            assert len(batch) <= seqs
            assert sum(s.num_new_tokens for s in batch) <= tokens
            assert all(s.num_computed_tokens + s.num_new_tokens <= model_len for s in batch)
        # the largest decode batch and the largest prompt are both there
        assert max(len(b) for b in batches) == min(seqs, tokens)
        assert max(b[0].num_new_tokens for b in batches) == min(tokens, model_len)


_TRITON_RUN = """
from rimuru.dataplane.engine.config import EngineConfig
from rimuru.dataplane.engine.engine import Engine
from rimuru.dataplane.engine.warmup import warm_up, warmup_batches

engine = Engine(EngineConfig(use_kernels=True, activation_reserve=0), log_plan=False)
batches = warmup_batches(16, 4, 64, 16)
seconds = warm_up(engine.model, engine.host_experts, engine.geometry, batches,
                  engine._moe_kernel(), engine._attention_kernels())
print("ran", len(batches), seconds > 0)
"""


def test_every_batch_runs_through_the_triton_forward():
    done = subprocess.run(
        [sys.executable, "-c", _TRITON_RUN],
        env=dict(os.environ, TRITON_INTERPRET="1"), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["ran", "10", "True"]
