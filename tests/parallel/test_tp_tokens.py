"""TP=2 gives TP=1's tokens, greedy and seeded-sampled, under every memory policy with a
pool tight enough that preemption, eviction and loading-buffer copies happen; the other
rank's expert page table equals rank 0's after every step (it checks each StepMessage's
digest and would exit, stopping the run) and at the end (Engine.close compares reports)."""

import random
from dataclasses import replace

import pytest

from rimuru.dataplane.engine.sched.request import SamplingParams
from rimuru.dataplane.engine.startup.capacity import plan_capacity
from rimuru.dataplane.engine.startup.config import EngineConfig
from rimuru.policy import Tunables

from .conftest import MiB, build, tight_pool

PARAMS = {
    "greedy": SamplingParams(max_tokens=16, ignore_eos=True),
    "seeded": SamplingParams(max_tokens=16, temperature=1.0, top_p=0.9, seed=5, ignore_eos=True),
}


@pytest.fixture(scope="module")
def prompts():
    rng = random.Random(7)
    return [[rng.randrange(151_000) for _ in range(rng.randint(40, 110))] for _ in range(8)]


def tiny(mode: str) -> EngineConfig:
    return EngineConfig(
        max_num_batched_tokens=128,
        loading_buffer_slots=32,
        tunables=Tunables(mode=mode, expert_offload_limit=16),
    )


POOL = 25 * MiB  # every expert of `tiny` is 24 MiB: KV runs short


@pytest.fixture(scope="module")
def expected(prompts):
    """TP=1's tokens (the same under every policy: tests/engine/test_policy_equivalence.py)."""
    one = build(None, tiny("resident"), POOL)
    return {name: one.generate(prompts, params) for name, params in PARAMS.items()}


@pytest.mark.parametrize("mode", ["resident", "fixed", "elastic"])
def test_tp2_tokens_equal_tp1_under_a_tight_pool(workers, prompts, expected, mode):
    two = build(workers, tiny(mode), POOL)
    # rimuru plan -tp 2 predicts each rank's pool
    (planned,) = plan_capacity(two.config, (mode,)).policies
    assert planned.plan.num_huge_pages == two.plan.num_huge_pages
    for name, params in PARAMS.items():
        assert two.generate(prompts, params) == expected[name], name
        two.check_invariants()
        assert two.num_leaked_pages() == 0
    two.close()  # raises unless rank 1 ran every forward and ends with rank 0's residency
    (report,) = two.tp.reports
    assert report.num_steps == two.tp.num_steps > 0
    if mode == "resident":
        assert two.scheduler.num_preemptions > 0
    if mode == "fixed":
        assert two.expert_counters.buffer_copies > 0
    if mode == "elastic":
        assert two.expert_counters.evictions > 0
        assert report.num_evictions > 0 and report.num_loads > 0


@pytest.fixture(scope="module")
def qwen2_checkpoint(tmp_path_factory):
    """A transformers-built Qwen2-MoE: q/k/v biases, a shared expert, a dense layer (0)."""
    import torch
    import transformers

    torch.manual_seed(1234)
    config = transformers.Qwen2MoeConfig(
        vocab_size=512, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.15,
        intermediate_size=128, moe_intermediate_size=32, shared_expert_intermediate_size=96,
        num_experts=8, num_experts_per_tok=4, norm_topk_prob=False, eos_token_id=None,
        decoder_sparse_step=2, mlp_only_layers=[0],
    )  # fmt: skip
    path = tmp_path_factory.mktemp("qwen2_moe")
    transformers.Qwen2MoeForCausalLM(config).eval().save_pretrained(path)
    return path


def tp2_after_tp1(workers, path, mode: str, prompts, pool, max_num_batched_tokens: int):
    """An fp32 checkpoint at TP=1 and TP=2 on `pool`: TP=2's tokens must be TP=1's. Returns
    the closed TP=2 engine (its counters and the follower's report)."""
    config = EngineConfig(
        model=str(path),
        dtype="float32",
        max_num_batched_tokens=max_num_batched_tokens,
        loading_buffer_slots=8,
        tunables=Tunables(mode=mode, expert_offload_limit=6),
    )
    one, two = build(None, config, pool), build(workers, config, pool)
    for name, params in PARAMS.items():
        assert two.generate(prompts, params) == one.generate(prompts, params), name
        two.check_invariants()
        assert two.num_leaked_pages() == 0
    two.close()
    return two


def test_tp2_tokens_equal_tp1_on_a_checkpoint(workers, qwen2_checkpoint):
    rng = random.Random(3)
    prompts = [[rng.randrange(512) for _ in range(rng.randint(20, 50))] for _ in range(6)]
    pool = tight_pool(kv_blocks=10, requests=0)
    two = tp2_after_tp1(workers, qwen2_checkpoint, "elastic", prompts, pool, 64)
    assert two.expert_counters.evictions > 0
    assert two.tp.reports[0].num_evictions > 0


# a pool of every expert plus (KV blocks, requests' states) that runs short
TIGHT_HYBRID = {"elastic": (6, 1), "resident": (4, 2)}


@pytest.mark.parametrize(
    ("family", "mode"), [("qwen3_next", "elastic"), ("qwen3_5_moe", "resident")]
)
def test_tp2_tokens_equal_tp1_on_a_hybrid_checkpoint(workers, hybrid_checkpoints, family, mode):
    """Gated DeltaNet heads split like attention heads, each rank's states in the pages rank 0
    gave the request."""
    _, path = hybrid_checkpoints[family]
    rng = random.Random(5)
    prompts = [[rng.randrange(512) for _ in range(rng.randint(12, 30))] for _ in range(4)]
    two = tp2_after_tp1(workers, path, mode, prompts, tight_pool(*TIGHT_HYBRID[mode]), 32)
    if mode == "elastic":
        assert two.expert_counters.evictions > 0 and two.tp.reports[0].num_evictions > 0
    else:
        assert two.scheduler.num_preemptions > 0


@pytest.fixture(scope="module")
def mqa_checkpoint(tmp_path_factory):
    """A transformers-built Qwen2-MoE with one KV head (MQA) and q/k/v biases: at TP=2 both
    ranks hold that head and its biases whole."""
    import torch
    import transformers

    torch.manual_seed(4321)
    config = transformers.Qwen2MoeConfig(
        vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, max_position_embeddings=256, initializer_range=0.15,
        moe_intermediate_size=32, shared_expert_intermediate_size=96, num_experts=8,
        num_experts_per_tok=4, norm_topk_prob=False, eos_token_id=None,
    )  # fmt: skip
    model = transformers.Qwen2MoeForCausalLM(config).eval()
    path = tmp_path_factory.mktemp("qwen2_moe_mqa")
    model.save_pretrained(path)
    return model, path


@pytest.fixture(scope="module")
def hybrid_mqa_checkpoint(hybrid_checkpoints, tmp_path_factory):
    """The Qwen3-Next fixture's shapes with one KV head in its gated attention layers."""
    import copy

    import torch

    config = copy.deepcopy(hybrid_checkpoints["qwen3_next"][0].config)
    config.num_key_value_heads = 1
    torch.manual_seed(4321)
    model = type(hybrid_checkpoints["qwen3_next"][0])(config).eval()
    path = tmp_path_factory.mktemp("qwen3_next_mqa")
    model.save_pretrained(path)
    return model, path


@pytest.mark.parametrize(
    ("checkpoint", "mode", "pool"),
    [
        ("mqa_checkpoint", "elastic", tight_pool(kv_blocks=10, requests=0)),
        ("hybrid_mqa_checkpoint", "resident", tight_pool(kv_blocks=12, requests=4)),
    ],
)
def test_tp2_replicates_a_single_kv_head_and_gives_transformers_tokens(
    workers, request, checkpoint, mode, pool
):
    import torch

    model, path = request.getfixturevalue(checkpoint)
    rng = random.Random(11)
    prompts = [[rng.randrange(512) for _ in range(rng.randint(20, 50))] for _ in range(4)]
    config = EngineConfig(
        model=str(path),
        dtype="float32",
        max_num_batched_tokens=64,
        loading_buffer_slots=8,
        tunables=Tunables(mode=mode, expert_offload_limit=6),
    )
    two = build(workers, config, pool)
    # A rank caches the whole KV head: its KV page is 16 tokens x 1 head x Dh of K and of V
    # (fp32), not half of one, and `rimuru plan -tp 2` sizes the same pages and pool.
    mc = two.model_config
    assert (mc.num_heads, mc.num_kv_heads) == (2, 1)
    assert two.geometry.kv_page_bytes == 2 * 16 * 1 * mc.head_dim * 4
    (planned,) = plan_capacity(two.config, (mode,)).policies
    assert planned.plan.num_huge_pages == two.plan.num_huge_pages
    ours = two.generate(prompts, PARAMS["greedy"])
    two.check_invariants()
    two.close()
    for prompt, tokens in zip(prompts, ours, strict=True):
        with torch.no_grad():
            ref = model.generate(
                torch.tensor([prompt]), do_sample=False, max_new_tokens=16, attention_mask=None
            )[0, len(prompt) :].tolist()
        assert tokens == ref


@pytest.mark.parametrize("mode", ["resident", "elastic"])
def test_tp2_with_prefix_caching_gives_tp1_tokens_without_it(workers, mode):
    """Prompts sharing prefixes: rank 1 reads the blocks rank 0's prefix cache shares (the
    same page ids in several requests' rows)."""
    rng = random.Random(3)
    systems = [[rng.randrange(151_000) for _ in range(n)] for n in (40, 70)]
    prompts = [systems[i % 2] + [rng.randrange(151_000) for _ in range(9 + i)] for i in range(8)]
    prompts += prompts[:2]
    params = PARAMS["greedy"]
    want = build(None, replace(tiny(mode), enable_prefix_caching=False), POOL).generate(
        prompts, params
    )
    two = build(workers, tiny(mode), POOL)
    assert two.generate(prompts, params) == want
    assert two.prefix_cache.num_hit_tokens > 0
    two.check_invariants()
    assert two.num_leaked_pages() == 0
    two.close()
