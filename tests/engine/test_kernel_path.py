"""The engine's Triton path (paged fused MoE + paged attention) gives the torch path's tokens.

Runs under the Triton interpreter in a subprocess: TRITON_INTERPRET must be set before
triton compiles anything, and must not leak into the rest of the suite."""

import json
import os
import subprocess
import sys

SCRIPT = r"""
import json, random, torch
torch.set_num_threads(1)
from rimuru.policy import Tunables
from rimuru.dataplane.engine.startup.config import EngineConfig
from rimuru.dataplane.engine.engine import Engine
from rimuru.dataplane.engine.sched.request import SamplingParams
rng = random.Random(3)
prompts = [[rng.randrange(151_000) for _ in range(rng.randint(6, 14))] for _ in range(3)]
out = {}
for kernels in (False, True):
    e = Engine(EngineConfig(activation_reserve=0, warmup=False, max_num_batched_tokens=64, memory_budget=200 * 2**20,
                            tunables=Tunables(mode="fixed"), fixed_expert_share=0.01, use_kernels=kernels),
               log_plan=False)
    out[str(kernels)] = e.generate(prompts, SamplingParams(max_tokens=2, ignore_eos=True))
    e.check_invariants()
    out[str(kernels) + "_copies"] = e.expert_counters.buffer_copies
    # one request whose whole context fits one KV block: [L, 1, 1] block tables
    out[str(kernels) + "_single"] = e.generate([prompts[0][:5]], SamplingParams(max_tokens=4, ignore_eos=True))
# resident: every expert in its pages, the kernel path without any host synchronisation
for kernels in (False, True):
    e = Engine(EngineConfig(activation_reserve=0, warmup=False, max_num_batched_tokens=64, memory_budget=200 * 2**20,
                            tunables=Tunables(mode="resident"), use_kernels=kernels), log_plan=False)
    out["resident_" + str(kernels)] = e.generate(prompts, SamplingParams(max_tokens=2, ignore_eos=True))
    out["resident_routed_" + str(kernels)] = int(e.moe_backend.routing_counts.sum())
# device copy-in: the copy kernel fills fixed slots, the MoE kernel reads them
for kernels in (False, True):
    e = Engine(EngineConfig(activation_reserve=0, warmup=False, max_num_batched_tokens=64, memory_budget=200 * 2**20,
                            tunables=Tunables(mode="fixed"), fixed_expert_share=0.01, use_kernels=kernels,
                            expert_copy="device"), log_plan=False)
    out["device_" + str(kernels)] = e.generate(prompts, SamplingParams(max_tokens=2, ignore_eos=True))
    out["device_copies_" + str(kernels)] = e.expert_counters.buffer_copies
    e.check_invariants()
print(json.dumps(out))
"""


def test_triton_path_matches_torch_path_under_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["True"] == out["False"]
    assert out["True_single"] == out["False_single"]
    assert out["True_copies"] > 0  # experts really came from loading-buffer slots
    assert out["resident_True"] == out["resident_False"] == out["True"]
    assert out["resident_routed_True"] == out["resident_routed_False"] > 0
    assert out["device_True"] == out["device_False"] == out["True"]
    assert out["device_copies_True"] == out["device_copies_False"] > 0
