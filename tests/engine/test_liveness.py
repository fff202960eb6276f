"""The liveness rule (engine/sched/liveness.py): at any budget around a model's resident size,
under every policy, with chunked prefill on and off, every request finishes with
transformers' tokens or is refused, within a bound of steps; never a spin.

The hybrid checkpoints' Gated DeltaNet states are large enough that an SSM page spans
several expert pages (the page geometry's huge page is their lcm), so a request's KV, SSM
and conv pages compete for the same free pages: counted one type at a time, each fitted
while all three did not, the round reported no shortfall and the request waited for ever.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import transformers
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rimuru.dataplane.engine.engine import Engine
from rimuru.dataplane.engine.sched.request import RequestStatus, SamplingParams
from rimuru.dataplane.engine.startup.config import EngineConfig
from rimuru.dataplane.engine.startup.setup import buffer_slots, loading_buffer_bytes
from rimuru.policy import Tunables

PROMPTS = [
    [5, 6, 7],
    [(37 * i + 11) % 512 for i in range(40)],
    [(11 * i + 3) % 512 for i in range(21)],
]
MAX_TOKENS = 4
MAX_STEPS = 2_000  # far above what these requests need, far below a spin's count

_SHAPES = dict(
    vocab_size=512,
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    moe_intermediate_size=32,
    num_experts=16,
    num_experts_per_tok=2,
    initializer_range=0.15,
    eos_token_id=None,
)
_GDN = dict(
    num_hidden_layers=6,
    full_attention_interval=2,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    shared_expert_intermediate_size=48,
)


def _models() -> dict[str, transformers.PreTrainedModel]:
    torch.manual_seed(99)
    nxt = dict(_SHAPES, **_GDN, linear_key_head_dim=64, linear_value_head_dim=32)
    q35 = dict(_SHAPES, **_GDN, linear_key_head_dim=64, linear_value_head_dim=64)
    return {
        "qwen3_moe": transformers.Qwen3MoeForCausalLM(
            transformers.Qwen3MoeConfig(
                **_SHAPES, num_hidden_layers=4, intermediate_size=96, norm_topk_prob=True
            )
        ),
        "qwen3_next": transformers.Qwen3NextForCausalLM(
            transformers.Qwen3NextConfig(**nxt, intermediate_size=96)
        ),
        "qwen3_5_moe": transformers.Qwen3_5MoeForCausalLM(
            transformers.Qwen3_5MoeTextConfig(**q35, tie_word_embeddings=True)
        ),
    }


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """{family: (checkpoint directory, transformers' greedy tokens of each prompt)}."""
    out = {}
    for family, model in _models().items():
        model.eval()
        path = tmp_path_factory.mktemp(family)
        model.save_pretrained(path)
        with torch.no_grad():
            expected = [
                model.generate(torch.tensor([p]), do_sample=False, max_new_tokens=MAX_TOKENS)[
                    0, len(p) :
                ].tolist()
                for p in PROMPTS
            ]
        out[family] = (path, expected)
    return out


def resident_bytes(config: EngineConfig) -> int:
    """The budget at which every expert just fits, with no page left for KV or states."""
    probe = Engine(replace(config, tunables=Tunables(mode="resident")), log_plan=False)
    g, mc = probe.geometry, probe.model_config
    experts = mc.num_moe_layers * mc.num_experts * 3 * g.expert_page_bytes
    buffers = loading_buffer_bytes(config, buffer_slots(config, mc), g)
    return probe.model.resident_nbytes() + buffers + experts


def run_to_end(engine: Engine) -> list[tuple[RequestStatus | None, list[int]]]:
    """(status, output) of each prompt; status None: refused when added (it can never
    fit, validate_request says)."""
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    ids = []
    for p in PROMPTS:
        try:
            ids.append(engine.add_request(p, params))
        except ValueError as exc:
            assert "can never fit in this pool" in str(exc)
            ids.append(None)
    steps = 0
    while engine.has_unfinished_requests():
        waiting = [r.request_id for r in engine.scheduler.waiting]
        assert steps < MAX_STEPS, f"no end after {steps} steps; waiting: {waiting}"
        engine.step()
        steps += 1
    engine.check_invariants()
    assert engine.num_leaked_pages() == 0
    return [
        (None, [])
        if i is None
        else (engine.requests[i].status, engine.requests[i].output_token_ids)
        for i in ids
    ]


@pytest.mark.parametrize("chunk", [16, 128], ids=["chunked", "whole-prompts"])
@pytest.mark.parametrize("mode", ["elastic", "fixed", "resident"])
@pytest.mark.parametrize("family", ["qwen3_moe", "qwen3_next", "qwen3_5_moe"])
def test_every_request_finishes_with_the_reference_tokens_or_is_refused(
    checkpoints, family, mode, chunk
):
    path, expected = checkpoints[family]
    config = EngineConfig(
        model=str(path),
        dtype="float32",
        activation_reserve=0,
        max_num_batched_tokens=chunk,
        tunables=Tunables(mode=mode),
    )
    base = resident_bytes(config)

    ran = []

    @settings(
        max_examples=8,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(pages=st.integers(-96, 96))
    def at_budget(pages: int) -> None:
        # KV-page-sized steps either side of the resident size (8 KiB pages at these shapes)
        try:
            engine = Engine(replace(config, memory_budget=base + pages * 8192), log_plan=False)
        except ValueError as exc:  # the policy cannot fit this budget: refused at start
            assert "does not fit a memory budget" in str(exc)
            return
        assert engine.geometry.kv_page_bytes == 8192
        for i, (status, out) in enumerate(run_to_end(engine)):
            if status is None or status is RequestStatus.FINISHED_REFUSED:
                continue
            assert status is RequestStatus.FINISHED_LENGTH
            assert out == expected[i], f"prompt {i} at {pages:+d} pages"
            ran.append(pages)

    at_budget()
    assert ran, "no budget let a request run: the test proved nothing"


@pytest.mark.parametrize("evict_to_admit", [False, True])
def test_a_lone_request_that_fits_is_never_refused_while_the_boundary_catches_up(
    evict_to_admit,
):
    """Without evicting inside the round, a lone growing request is preempted whenever it
    outgrows the boundary, which then moves between rounds: each time it got further, so
    it is catching up, not stuck, and must finish (tiny preset, a pool of every expert)."""
    config = EngineConfig(
        activation_reserve=0,
        max_num_batched_tokens=128,
        evict_to_admit=evict_to_admit,
        tunables=Tunables(mode="elastic"),
    )
    engine = Engine(replace(config, memory_budget=resident_bytes(config)), log_plan=False)
    prompt, max_tokens = [(7 * i + 3) % 1000 for i in range(270)], 330
    assert len(prompt) + max_tokens <= engine.max_kv_tokens()
    rid = engine.add_request(prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    steps = 0
    while engine.has_unfinished_requests():
        assert steps < 5 * MAX_STEPS
        engine.step()
        steps += 1
    assert engine.requests[rid].status is RequestStatus.FINISHED_LENGTH
    assert engine.num_refused == 0 and engine.num_leaked_pages() == 0
