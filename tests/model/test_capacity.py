"""`rimuru plan` / `plan_capacity` give the engine's own start-up figures without loading
weights: the same memory plan, experts resident and KV room as a real engine, for every model
family (checkpoints from tests/model/conftest.py) and the tiny preset."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from rimuru.cli import main
from rimuru.dataplane.engine.engine import Engine
from rimuru.dataplane.engine.startup.capacity import PolicyCapacity, plan_capacity
from rimuru.dataplane.engine.startup.config import EngineConfig
from rimuru.dataplane.memory.geometry import BLOCK_SIZE, PageType
from rimuru.policy import MODES, HotnessRanking, Tunables

MiB = 2**20


def assert_plan_is_the_engines(config: EngineConfig) -> list[PolicyCapacity]:
    planned = plan_capacity(config, MODES).policies
    for policy, cap in zip(MODES, planned, strict=True):
        assert isinstance(cap, PolicyCapacity), cap
        engine = Engine(
            replace(config, tunables=replace(config.tunables, mode=policy)), log_plan=False
        )
        mc = engine.model_config
        assert cap.plan == engine.plan
        assert cap.experts_at_start == engine.residency.num_resident()
        kv_pages = engine.allocator.num_free(PageType.KV)
        assert cap.kv_tokens_at_start == kv_pages // mc.num_layers * BLOCK_SIZE
    return list(planned)


@pytest.mark.parametrize("family", ["qwen2_moe", "qwen3_moe", "mixtral"])
def test_plan_equals_a_real_engine_for_each_family(hf_checkpoints, family):
    probe = EngineConfig(
        model=str(hf_checkpoints[family].path),
        memory_budget=64 * MiB,
        activation_reserve=256 * 1024,
        tunables=Tunables(expert_offload_limit=3),
        fixed_expert_share=0.4,
    )
    sizes = plan_capacity(probe, ("resident",))
    page = sizes.geometry.expert_page_bytes
    # a pool of 30 experts beside device copy-in's one unread slot: fixed caches 0.4 x what
    # the pool holds once its loading slots are taken (as many as a layer offloads)
    budget = sizes.non_pool_weight_bytes + 256 * 1024 + (3 + 30 * 3) * page
    config = replace(probe, memory_budget=budget)
    resident, fixed, elastic = assert_plan_is_the_engines(config)
    # the policies differ as designed: fixed keeps fewer experts, elastic can go down to E - 3
    assert fixed.experts_at_start < resident.experts_at_start == elastic.experts_at_start
    assert elastic.experts_at_least == 2 * (8 - 3)
    assert elastic.kv_tokens_at_most > elastic.kv_tokens_at_start


def test_plan_equals_a_real_engine_with_device_copy_in():
    """Device copy-in keeps one unread slot outside the pool (its slots are pool pages), host
    copies two buffers: the pool gains the difference, as in the engine."""
    config = EngineConfig(
        memory_budget=304 * MiB, max_num_batched_tokens=1024, expert_copy="device"
    )
    device = assert_plan_is_the_engines(config)
    host = plan_capacity(replace(config, expert_copy="host"), MODES).policies
    page = 64 * 1024  # tiny: a matrix fills its page
    for d, h, slots in zip(device, host, (1, 32, 8), strict=True):  # resident, fixed, elastic
        assert d.plan.loading_buffer_bytes == 3 * page
        assert h.plan.loading_buffer_bytes == 2 * 3 * slots * page
        # what host copies hold outside goes to the pool, rounded down to whole huge pages
        gained = d.plan.pool_bytes - h.plan.pool_bytes
        outside = h.plan.loading_buffer_bytes - d.plan.loading_buffer_bytes
        assert 0 <= outside - gained < d.plan.huge_page_bytes


def test_plan_equals_a_real_engine_for_the_tiny_preset_with_router_skew():
    config = EngineConfig(memory_budget=304 * MiB, max_num_batched_tokens=1024)
    assert_plan_is_the_engines(config)  # the skew's fp32 router bias is counted too
    no_skew = plan_capacity(replace(config, router_skew=0.0), ("resident",)).non_pool_weight_bytes
    skewed = plan_capacity(config, ("resident",)).non_pool_weight_bytes
    assert skewed - no_skew == 4 * 32 * 4  # layers x experts x fp32


def test_cli_prints_each_policy_and_says_why_one_does_not_fit(capsys):
    code = main(
        ["plan", "--model", "qwen3-30b-a3b", "--memory-budget", "20GiB",
         "--max-num-batched-tokens", "1024"]
    )  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0  # fixed fits
    _, geometry, _, *table, graphs = out.splitlines()
    # 768 x 2048 bf16 expert pages; 32 KiB KV pages divide them: no padding
    assert geometry == "page geometry: huge page 3145728 B; expert page 3145728 B, kv page 32768 B"
    rows = [line.split() for line in table]
    fixed = plan_capacity(
        EngineConfig(model="qwen3-30b-a3b", memory_budget=20 * 2**30, max_num_batched_tokens=1024),
        ("fixed",),
    ).policies[0]
    assert [r[0] for r in rows] == ["fixed"]
    assert rows[0][5:7] == [str(fixed.experts_at_start), str(fixed.kv_tokens_at_start)]
    assert "resident: does not fit: the pool" in err and "cannot hold the 6144 experts" in err
    # the limit `rimuru serve` starts with by default, not bench's 16
    assert "elastic: does not fit" in err and "expert_offload_limit=8" in err
    # the graphs' driver memory the engine will set aside on CUDA: qwen3's 48 layers, 35
    # decode graphs (max_num_seqs 256) and 32 piecewise sizes (1024 tokens) at the prices
    assert "the driver's part 231.0 MiB for the decode graphs and 431.2 MiB" in graphs


def test_cli_exits_2_when_nothing_fits_or_input_is_bad(capsys):
    assert main(["plan", "--model", "tiny", "--memory-budget", "1MiB"]) == 2
    assert "does not fit" in capsys.readouterr().err
    assert main(["plan", "--memory-budget", "1GiB", "--policies", "cached"]) == 2
    assert "unknown policy ['cached']" in capsys.readouterr().err
    assert main(["plan", "--memory-budget", "lots"]) == 2
    assert "rimuru plan:" in capsys.readouterr().err


def test_plan_follows_the_hotness_ranking_like_the_engine(tmp_path):
    # a skewed ranking spreads the fixed cache over the layers; with a uniform one the cache
    # fills whole layers in order. 20 slots only fit the spread.
    rng = random.Random(5)
    counts = [[rng.random() ** 4 for _ in range(32)] for _ in range(4)]
    HotnessRanking.from_counts(counts).save(tmp_path / "hot.json")
    config = EngineConfig(
        memory_budget=304 * MiB,
        max_num_batched_tokens=1024,
        loading_buffer_slots=20,
        fixed_expert_share=0.45,
        hotness_path=str(tmp_path / "hot.json"),
    )
    fixed = plan_capacity(config, ("fixed",)).policies[0]
    assert isinstance(fixed, PolicyCapacity), fixed
    engine = Engine(replace(config, tunables=Tunables(mode="fixed")), log_plan=False)
    assert fixed.experts_at_start == engine.residency.num_resident()
    assert fixed.kv_tokens_at_start == engine.allocator.num_free(PageType.KV) // 4 * 16
    uniform = plan_capacity(replace(config, hotness_path=None), ("fixed",)).policies[0]
    assert isinstance(uniform, str) and "leaves 32 experts of a layer" in uniform


@pytest.mark.parametrize("preset", ["tiny", "tiny-hybrid"])
def test_the_plans_non_pool_weights_are_what_the_engine_holds(preset):
    """Shapes alone (meta tensors) against the loaded model: q, k and v fused into one
    matrix at load (its views not counted twice), a hybrid's GDN and gated attention."""
    from rimuru.dataplane.engine.engine import Engine
    from rimuru.dataplane.engine.startup.capacity import non_pool_weight_bytes

    engine = Engine(EngineConfig(model=preset, activation_reserve=0), log_plan=False)
    skew = engine.config.router_skew
    planned = non_pool_weight_bytes(engine.model_config, engine.dtype, skew)
    assert engine.model.resident_nbytes() == planned


def test_plan_refuses_a_context_past_the_models_as_the_engine_does(capsys):

    argv = ["plan", "--model", "tiny", "--memory-budget", "1GiB", "--max-model-len", "32769"]
    assert main(argv) == 2
    assert "max_model_len=32769 exceeds the model's context of 32768 tokens" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize(
    ("preset", "expert_page", "huge_page", "padding", "scale_bytes"),
    [
        # 768 x 2048 e4m3 = 1.5 MiB; 48 layers x 128 experts x (6x16 + 6x16 + 16x6) fp32
        ("qwen3-30b-a3b", 1_572_864, 1_572_864, "kv page 32768 B", 48 * 128 * 288 * 4),
        # 512 x 2048 e4m3 = 1 MiB beside the 2 MiB SSM page; the 48 KiB conv state still
        # takes a 64 KiB slot; 40 layers x 256 experts x (4x16 + 4x16 + 16x4) fp32
        (
            "qwen3.5-35b-a3b",
            1_048_576,
            2_097_152,
            "conv page 49152 B in a 65536 B slot",
            40 * 256 * 192 * 4,
        ),
    ],
)
def test_fp8_presets_plan_half_sized_expert_pages(
    capsys, preset, expert_page, huge_page, padding, scale_bytes
):
    """Block-FP8 expert pages hold e4m3 bytes only: half a BF16 page, the same KV pages; the
    scales are counted with the non-pool weights, which are otherwise the BF16 model's."""
    budget = int(28.8 * 2**30)
    fp8, bf16 = (
        plan_capacity(
            EngineConfig(model=name, memory_budget=budget, max_num_batched_tokens=1024),
            ("fixed",),
        )
        for name in (preset + "-fp8", preset)
    )
    g = fp8.geometry
    assert g.expert_page_bytes == expert_page == bf16.geometry.expert_page_bytes // 2
    assert g.huge_page_bytes == huge_page
    assert g.kv_page_bytes == bf16.geometry.kv_page_bytes
    assert fp8.expert_bytes == bf16.expert_bytes // 2
    assert fp8.non_pool_weight_bytes - bf16.non_pool_weight_bytes == scale_bytes
    argv = ["plan", "--model", preset + "-fp8", "--memory-budget", "28.8GiB"]
    assert main([*argv, "--max-num-batched-tokens", "1024"]) in (0, 2)
    out = capsys.readouterr().out
    assert f"huge page {huge_page} B; expert page {expert_page} B" in out and padding in out


def test_plan_equals_a_real_engine_for_the_tiny_fp8_preset():
    config = EngineConfig(model="tiny-fp8", memory_budget=304 * MiB, max_num_batched_tokens=1024)
    assert_plan_is_the_engines(config)  # FP8 pages and the scales beside the pool
