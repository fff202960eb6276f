"""Block-FP8 checkpoints served end to end on the torch path: routed experts stay FP8 in the
pool and on the host (pages of half the bytes), and every memory policy gives the greedy
tokens of the same model with its weights dequantized, served by transformers and by the
engine as a plain checkpoint. One attention-only and one hybrid architecture, with weights
of more than one 128 x 128 block per matrix (and partial blocks); every family loads and
serves resident."""

from __future__ import annotations

import pytest
import torch
import transformers

from rimuru.dataplane.engine.engine import Engine
from rimuru.dataplane.engine.sched.request import SamplingParams
from rimuru.dataplane.engine.startup.config import EngineConfig
from rimuru.dataplane.memory.geometry import PageType
from rimuru.dataplane.model.config import FP8_BLOCK128
from tests.block_fp8_checkpoints import write_fp8_twins

PROMPTS = [[(11 * i + 5 * j) % 512 for j in range(30 + 13 * i)] for i in range(6)]
MAX_TOKENS = 8
_COMMON = dict(
    vocab_size=512,
    hidden_size=256,  # two blocks along D
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=256,
    moe_intermediate_size=160,  # a block and a partial one along I
    num_experts=8,
    num_experts_per_tok=2,
    initializer_range=0.1,
    eos_token_id=None,
)


def _models() -> dict[str, transformers.PreTrainedModel]:
    torch.manual_seed(4321)
    qwen3 = transformers.Qwen3MoeConfig(**_COMMON, num_hidden_layers=2, norm_topk_prob=True)
    qwen35 = transformers.Qwen3_5MoeTextConfig(
        **_COMMON,
        num_hidden_layers=2,
        full_attention_interval=2,  # layer 0 Gated DeltaNet, layer 1 gated attention
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=8,
        shared_expert_intermediate_size=96,
    )
    hybrid = {k: v for k, v in qwen35.to_dict().items() if k in _HYBRID_KEYS}
    qwen3_next = transformers.Qwen3NextConfig(**_COMMON, **hybrid, intermediate_size=128)
    mixtral = {
        k: v for k, v in _COMMON.items() if k not in ("moe_intermediate_size", "num_experts")
    }
    mixtral = transformers.MixtralConfig(
        **mixtral, num_hidden_layers=2, num_local_experts=8, intermediate_size=160
    )
    return {
        "qwen3_moe": transformers.Qwen3MoeForCausalLM(qwen3),
        "qwen3_5_moe": transformers.Qwen3_5MoeForCausalLM(qwen35),
        "qwen3_next": transformers.Qwen3NextForCausalLM(qwen3_next),
        "mixtral": transformers.MixtralForCausalLM(mixtral),
    }


_HYBRID_KEYS = (
    "num_hidden_layers",
    "layer_types",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "shared_expert_intermediate_size",
)


@pytest.fixture(scope="module")
def fp8_twins(tmp_path_factory):
    """{family: (fp8 dir, plain dir, transformers tokens of the plain twin per prompt)}."""
    out = {}
    for family, model in _models().items():
        root = tmp_path_factory.mktemp(family)
        model.eval().save_pretrained(root / "src")
        fp8, plain = write_fp8_twins(root / "src", root)
        dequantized = transformers.AutoModelForCausalLM.from_pretrained(plain).eval()
        with torch.no_grad():
            ref = [
                dequantized.generate(torch.tensor([p]), do_sample=False, max_new_tokens=MAX_TOKENS)[
                    0, len(p) :
                ].tolist()
                for p in PROMPTS
            ]
        out[family] = (fp8, plain, ref)
    return out


def _tokens(engine: Engine) -> list[list[int]]:
    got = engine.generate(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
    engine.check_invariants()
    assert engine.num_leaked_pages() == 0
    return got


@pytest.mark.parametrize("family", ["qwen3_moe", "qwen3_5_moe", "qwen3_next", "mixtral"])
def test_resident_fp8_gives_the_dequantized_models_tokens(
    fp8_twins, make_checkpoint_engine, family
):
    fp8, plain, ref = fp8_twins[family]
    engine = make_checkpoint_engine(fp8, "resident", None)
    mc = engine.model_config
    assert mc.quant == FP8_BLOCK128
    assert engine.pool.view(PageType.EXPERT).dtype == torch.float8_e4m3fn
    assert all(w.is_fp8 for w in engine.host_experts)
    twin = make_checkpoint_engine(plain, "resident", None)
    # half the bytes per page: e4m3 against the plain twin's fp32 is a quarter
    assert engine.geometry.expert_page_bytes == mc.moe_intermediate_size * mc.hidden_size
    assert twin.geometry.expert_page_bytes == 4 * engine.geometry.expert_page_bytes
    assert _tokens(engine) == _tokens(twin) == ref


@pytest.mark.parametrize("family", ["qwen3_moe", "qwen3_5_moe"])
@pytest.mark.parametrize(
    ("mode", "expert_copy"), [("fixed", "host"), ("elastic", "host"), ("elastic", "device")]
)
def test_offloading_fp8_experts_changes_no_token(
    fp8_twins, make_checkpoint_engine, family, mode, expert_copy
):
    fp8, plain, ref = fp8_twins[family]
    # room for every expert, 2 blocks of all layers and one request's states: pages run short
    engine = make_checkpoint_engine(fp8, mode, 2, requests=1, expert_copy=expert_copy)
    mc = engine.model_config
    got = _tokens(engine)
    all_experts = mc.num_moe_layers * mc.num_experts
    assert min(s.num_experts_resident for s in engine.stats) < all_experts
    if mode == "elastic" and family == "qwen3_moe":
        # the hybrid's one attention layer never runs its KV short enough for the cost rule
        assert engine.expert_counters.evictions > 0
    # offloaded FP8 experts were copied in, at one byte per weight
    expert_bytes = 3 * mc.moe_intermediate_size * mc.hidden_size
    assert engine.expert_counters.bytes_h2d > 0
    assert engine.expert_counters.bytes_h2d % expert_bytes == 0
    twin = make_checkpoint_engine(plain, mode, None, expert_copy=expert_copy)
    assert got == _tokens(twin) == ref


def test_fp8_with_triton_kernels_is_refused_at_start_up(fp8_twins):
    config = EngineConfig(model=str(fp8_twins["qwen3_moe"][0]), use_kernels=True)
    with pytest.raises(ValueError, match=r"block-FP8 .* runs only on the torch reference path"):
        Engine(config, log_plan=False)
