"""The pieces of tensor parallelism that need no second process: slicing, the per-rank
config, the residency diff, the block tables' rows, the flags."""

import argparse

import numpy as np
import pytest
import torch

from rimuru.cli import main
from rimuru.dataplane.adjust.adjuster import ChangeList, ExpertLoad
from rimuru.dataplane.engine.flags import add_engine_arguments, engine_config_from_args
from rimuru.dataplane.engine.forward.block_table_store import DeviceBlockTables
from rimuru.dataplane.engine.forward.paged_attention import SequenceSlice
from rimuru.dataplane.engine.sched.request import Request, RequestStatus, SamplingParams
from rimuru.dataplane.engine.sched.round_moves import net_changes
from rimuru.dataplane.engine.startup.config import EngineConfig
from rimuru.dataplane.memory.tables import NOT_PRESENT, ExpertPageTable
from rimuru.dataplane.model.checkpoint import RandomWeights, preset_config
from rimuru.dataplane.model.checkpoint.shard import (
    ShardedWeights,
    TensorShard,
    check_shardable,
    shard_config,
)
from rimuru.dataplane.parallel.block_tables import BlockTableMirror, BlockTableSender
from rimuru.dataplane.parallel.residency import table_digest


def test_ranks_slices_put_together_are_the_whole_layer():
    source = RandomWeights.preset("tiny")
    ranks = [ShardedWeights(source, TensorShard(r, 2)) for r in range(2)]
    cpu, f32 = torch.device("cpu"), torch.float32
    whole, parts = source.layer_weights(1, cpu, f32), [r.layer_weights(1, cpu, f32) for r in ranks]
    a, pa = whole.attention, [p.attention for p in parts]
    for name in ("q_proj", "k_proj", "v_proj"):  # column parallel: rows of whole heads
        assert torch.equal(torch.cat([getattr(p, name) for p in pa]), getattr(a, name))
    assert torch.equal(torch.cat([p.o_proj for p in pa], dim=1), a.o_proj)  # row parallel
    assert all(torch.equal(p.router, whole.router) for p in parts)  # replicated
    experts = source.expert_weights(0, f32)
    slices = [r.expert_weights(0, f32) for r in ranks]
    assert torch.equal(torch.cat([s.w1 for s in slices], dim=1), experts.w1)  # along I
    assert torch.equal(torch.cat([s.w2 for s in slices], dim=2), experts.w2)
    assert slices[1].w1.is_contiguous()  # a page copy reads it flat


def test_a_rank_config_has_its_share_of_heads_and_expert_width():
    mc = preset_config("qwen1.5-moe-a2.7b")
    rank = shard_config(mc, 4)
    assert (rank.num_heads, rank.num_kv_heads) == (mc.num_heads // 4, mc.num_kv_heads // 4)
    assert rank.moe_intermediate_size == mc.moe_intermediate_size // 4
    assert rank.shared_expert_intermediate_size == mc.shared_expert_intermediate_size // 4
    assert (rank.hidden_size, rank.num_experts, rank.vocab_size) == (
        mc.hidden_size, mc.num_experts, mc.vocab_size,
    )  # fmt: skip


def test_sizes_that_do_not_divide_are_refused():
    with pytest.raises(ValueError, match="must divide the model's num_attention_heads 4"):
        check_shardable(preset_config("tiny"), 3)
    with pytest.raises(ValueError, match="linear_num_key_heads 2"):
        check_shardable(preset_config("tiny-hybrid"), 4)
    # 3 KV heads on 2 ranks: the ranks neither split them nor hold each the same number of
    # times (vLLM asks Hkv % TP == 0, or TP % Hkv == 0 to replicate), so it is refused.
    three = preset_config("tiny").replace(num_heads=6, num_kv_heads=3, moe_intermediate_size=96)
    with pytest.raises(ValueError) as err:
        check_shardable(three, 2)
    assert str(err.value) == (
        "--tensor-parallel-size 2 must divide the model's num_key_value_heads 3, or be a "
        "multiple of it (fewer KV heads than ranks are replicated, each on TP/3 ranks, as vLLM "
        "does): choose a size that does (sizes that fit this model: [1, 3, 6])"
    )


@pytest.mark.parametrize(
    ("num_kv_heads", "size", "holders"), [(2, 4, [0, 0, 1, 1]), (1, 2, [0, 0])]
)
def test_fewer_kv_heads_than_ranks_are_replicated(num_kv_heads, size, holders):
    """Rank r holds KV head r*Hkv//TP whole (k, v rows and biases), the one its query heads
    attend with; its config caches one KV head, so its KV pages are that head's bytes."""
    mc = preset_config("tiny").replace(num_kv_heads=num_kv_heads, qkv_bias=True)
    source = RandomWeights(mc)
    cpu, f32, dh = torch.device("cpu"), torch.float32, mc.head_dim
    whole = source.layer_weights(1, cpu, f32).attention
    rank_config = shard_config(mc, size)
    assert (rank_config.num_heads, rank_config.num_kv_heads) == (mc.num_heads // size, 1)
    group = mc.num_heads // num_kv_heads  # query heads per KV head
    for rank, head in enumerate(holders):
        part = ShardedWeights(source, TensorShard(rank, size)).layer_weights(1, cpu, f32)
        a = part.attention
        for name in ("k_proj", "v_proj", "k_bias", "v_bias"):
            assert torch.equal(getattr(a, name), getattr(whole, name)[head * dh : (head + 1) * dh])
        first_q_head, num_q_rows = rank * mc.num_heads // size, mc.num_heads // size * dh
        assert first_q_head // group == head  # the KV head this rank's queries read
        q_rows = whole.q_proj[first_q_head * dh :][:num_q_rows]
        assert torch.equal(a.q_proj, q_rows)


def test_a_gated_attention_rank_replicates_its_kv_head():
    mc = preset_config("tiny-hybrid").replace(num_kv_heads=1)
    source, cpu, f32 = RandomWeights(mc), torch.device("cpu"), torch.float32
    (layer,) = mc.full_attention_layers
    whole = source.layer_weights(layer, cpu, f32).mixer
    for rank in range(2):
        mixer = ShardedWeights(source, TensorShard(rank, 2)).layer_weights(layer, cpu, f32).mixer
        assert torch.equal(mixer.k_proj, whole.k_proj) and torch.equal(mixer.v_proj, whole.v_proj)
        assert mixer.q_proj.shape[0] == whole.q_proj.shape[0] // 2


def test_a_hybrid_rank_has_its_share_of_gated_deltanet_heads():
    mc = preset_config("qwen3.5-35b-a3b")
    gdn, rank = mc.linear_attention, shard_config(mc, 2).linear_attention
    assert (rank.num_key_heads, rank.num_value_heads) == (
        gdn.num_key_heads // 2, gdn.num_value_heads // 2,
    )  # fmt: skip
    assert rank.key_head_dim == gdn.key_head_dim and rank.value_head_dim == gdn.value_head_dim


def test_the_moves_net_to_loads_moves_and_evictions_and_the_digest_follows_the_table():
    table = ExpertPageTable(2, 4)
    start_up = ChangeList(load=(ExpertLoad(0, 1, (3, 4, 5)), ExpertLoad(1, 2, (6, 7, 8))))
    for load in start_up.load:
        table.set_pages(load.layer, load.expert, load.pages)
    assert net_changes([start_up]) == start_up
    before = table_digest(table.host)
    # two rounds before the next message: (0, 1) evicted; (1, 2) evicted, then back at
    # new pages (moved: a load at its new pages, no eviction)
    rounds = [ChangeList(evict=((0, 1), (1, 2))), ChangeList(load=(ExpertLoad(1, 2, (0, 1, 2)),))]
    table.clear(0, 1)
    table.set_pages(1, 2, (0, 1, 2))
    assert net_changes(rounds) == ChangeList(evict=((0, 1),), load=(ExpertLoad(1, 2, (0, 1, 2)),))
    assert net_changes([]) == ChangeList()  # nothing since
    assert table_digest(table.host) != before
    assert table.host[0, 1, 0] == NOT_PRESENT


def test_the_flag_and_its_short_spelling():
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    assert engine_config_from_args(parser.parse_args(["-tp", "2"])).tensor_parallel_size == 2
    args = parser.parse_args(["--tensor-parallel-size", "4", "--device", "cuda"])
    assert engine_config_from_args(args).tensor_parallel_size == 4


def test_config_refuses_a_pinned_gpu_with_several_ranks():
    with pytest.raises(ValueError, match="rank r takes cuda:r"):
        EngineConfig(device="cuda:1", tensor_parallel_size=2)
    with pytest.raises(ValueError, match="tensor_parallel_size must be >= 1"):
        EngineConfig(tensor_parallel_size=0)


def test_block_tables_travel_as_new_rows_and_restart_after_preemption():
    sender, mirror = BlockTableSender(), BlockTableMirror()
    a = Request("a", [1, 2, 3], SamplingParams(), num_layers=2)
    b = Request("b", [4, 5], SamplingParams(), num_layers=2)
    held = {}  # the follower's tables
    # the follower's device store, with a row for each of 2 requests running at once (a
    # forgotten table must give its row back, or a third request finds none)
    store = DeviceBlockTables(num_layers=2, num_rows=2, width=4, block_size=16, device="cpu")

    def step(*requests):
        delta = sender.delta(list(requests))
        slices = [SequenceSlice(0, 1, 0, r.block_table) for r in requests]
        got = mirror.slices(delta, BlockTableSender.bare(slices))
        for r, s in zip(requests, got, strict=True):  # the follower's tables are rank 0's
            assert np.array_equal(s.table.array(), r.block_table.array())
            held[r.request_id] = s.table
        store.assign([s.table for s in got])
        store.upload(np.empty(0, np.int32))
        store.check_invariants()
        return delta

    a.block_table.append_block([0, 1])
    b.block_table.append_block([2, 3])
    assert [len(d.rows) for d in step(a, b).rows] == [1, 1]
    a.block_table.append_block([4, 5])
    assert [(d.start, len(d.rows)) for d in step(a, b).rows] == [(1, 1), (1, 0)]  # only news
    a.block_table.pop_blocks()  # preempted: its pages freed, rebuilt from row 0
    a.num_preemptions += 1
    b.status = RequestStatus.FINISHED_LENGTH
    old_a, old_b = held["a"], held["b"]
    delta = step()  # a waits: both tables are forgotten, and emptied for the device store
    assert delta.forget == ("a", "b") and len(mirror) == 0
    assert (len(old_a), old_a.epoch, len(old_b), old_b.epoch) == (0, 1, 0, 1)
    a.block_table.append_block([6, 7])  # re-admitted, beside a new request
    c = Request("c", [1], SamplingParams(), num_layers=2)
    c.block_table.append_block([10, 11])
    delta = step(a, c)
    assert delta.forget == () and (delta.rows[0].start, delta.rows[0].epoch) == (0, 1)
    assert held["a"] is not old_a and len(mirror) == 2
    a.status = RequestStatus.FINISHED_STOPPED
    again = Request("a", [9], SamplingParams(), num_layers=2)  # an id used again
    again.block_table.append_block([8, 9])
    delta = step(again, c)
    assert delta.forget == ("a",) and delta.rows[0].start == 0 and len(mirror) == 2


def test_plan_sizes_a_replicated_kv_head_whole(capsys):
    """tiny has 2 KV heads: at -tp 4 each is on 2 ranks, and a rank's KV page holds one
    whole head (16 tokens x 1 head x 32 dims of K and V, fp32), not half of one."""
    assert main(["plan", "--model", "tiny", "--memory-budget", "400MiB", "-tp", "4"]) == 0
    out = capsys.readouterr().out
    assert (
        "the model's 2 KV head(s) are fewer than the ranks, so each is replicated on 2 ranks" in out
    )
    assert f"kv page {2 * 16 * 1 * 32 * 4} B" in out
    assert main(["plan", "--model", "tiny", "--memory-budget", "400MiB", "-tp", "2"]) == 0
    assert "replicated" not in capsys.readouterr().out  # 2 heads on 2 ranks: split
