"""Decode steps through the CUDA-graph inputs (static buffers, batch padded to a capture
size, padding rows on reserved pages) give the eager engine's tokens and statistics.

A CPU cannot capture, so the graphs run their static inputs eagerly here (capture=False);
bench/gpu_checks.py compares captured replays with eager steps on the GPU."""

import pytest
import torch

from rimuru.dataplane.engine.graphs.cuda_graphs import (
    GRAPH_PADDING,
    capture_sizes,
    decode_driver_bytes,
)
from rimuru.dataplane.engine.graphs.piecewise_graphs import piece_driver_bytes
from rimuru.dataplane.engine.sched.request import SamplingParams
from rimuru.dataplane.memory.geometry import BLOCK_SIZE, PageType


def test_capture_sizes_follow_vllm_and_end_at_max_num_seqs():
    assert capture_sizes(256)[:6] == (1, 2, 4, 8, 16, 24)
    assert capture_sizes(256)[-1] == 256 and len(capture_sizes(256)) == 3 + 32
    assert capture_sizes(5) == (1, 2, 4, 5)
    assert capture_sizes(1) == (1,)
    assert capture_sizes(12) == (1, 2, 4, 8, 12)


def _graph_engine(make_engine, mode, sizes=None, **overrides):
    engine = make_engine(mode, **overrides)
    free_before = engine.allocator.num_free(PageType.KV)
    graphs = engine.make_cuda_graphs(capture=False)
    assert graphs is not None
    if sizes is not None:
        graphs.sizes = sizes
    # one padding page per layer, owned as such, and zeroed
    assert engine.allocator.num_free(PageType.KV) == free_before - engine.model_config.num_layers
    owners = {
        engine.allocator.owner_of(PageType.KV, p) for p in engine.cuda_graphs.decode.pad_pages
    }
    assert owners == {GRAPH_PADDING}
    return engine


@pytest.mark.parametrize("mode", ["resident", "elastic"])
def test_padded_static_decode_gives_the_eager_tokens_and_routing_counts(prompts, make_engine, mode):
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    # staggered lengths: decode batches of every size 1..5 appear, most of them padded
    batch = prompts[:5]
    eager = make_engine(mode)
    want = eager.generate(batch, params)
    engine = _graph_engine(make_engine, mode, sizes=(1, 2, 4, 8))
    got = engine.generate(batch, params)
    assert got == want
    assert engine.cuda_graphs.decode.steps > 0 and engine.cuda_graphs.decode.replays == 0
    # padding rows routed somewhere, but were not counted
    assert torch.equal(engine.moe_backend.routing_counts, eager.moe_backend.routing_counts)
    kv = engine.pool.view(PageType.KV)
    assert not kv[engine.cuda_graphs.decode.pad_pages].any(), "a padding row wrote KV"
    engine.check_invariants()
    assert engine.num_leaked_pages() == 0


def test_a_step_with_a_prompt_or_an_offloaded_expert_runs_eagerly(prompts, make_engine):
    """Host copies: a layer with an offloaded expert syncs, so its step cannot be a graph
    (device copy-in keeps it one: test_device_copy.py)."""
    # resident: its adjuster never brings the evicted expert back
    engine = _graph_engine(make_engine, "resident", expert_copy="host")
    graphs = engine.cuda_graphs.decode
    engine.add_request(prompts[0], SamplingParams(max_tokens=4, ignore_eos=True))
    engine.step()  # the prompt: eager
    assert graphs.steps == 0
    engine.step()  # one decode, every expert resident: static inputs
    assert graphs.steps == 1
    engine.residency.evict(0, 0, last_step=engine.step_id)
    engine.step()  # an expert of layer 0 is off the device: eager
    assert graphs.steps == 1


def test_contexts_beyond_max_seq_len_to_capture_run_eagerly(prompts, make_engine):
    # the config's limit reaches the graphs: the first decode fits, the second not
    engine = _graph_engine(make_engine, "resident", max_seq_len_to_capture=len(prompts[0]) + 1)
    assert engine.cuda_graphs.decode.max_context == len(prompts[0]) + 1
    engine.generate([prompts[0]], SamplingParams(max_tokens=3, ignore_eos=True))
    assert engine.cuda_graphs.decode.steps == 1


def test_the_padding_pages_shrink_the_longest_request_accepted(make_engine):
    """One padding page per layer is one 16-token block less for requests: a request sized
    to the old limit is refused up front instead of being preempted forever."""
    engine = make_engine("resident")
    before = engine.max_kv_tokens()
    engine.make_cuda_graphs(capture=False)
    assert engine.max_kv_tokens() == before - BLOCK_SIZE
    with pytest.raises(ValueError, match="can never fit"):
        engine.add_request([5] * (before - 1), SamplingParams(max_tokens=1))


@pytest.mark.parametrize(
    "pool_mib, extra_mib, fits", [(26, 0, True), (26, 3, False), (20, 0, False)]
)
def test_graph_memory_is_planned_only_when_every_expert_starts_resident(
    make_engine, pool_mib, extra_mib, fits
):
    """The tiny preset's experts take 24 MiB: graphs (which need every expert resident) are
    worth their memory only if the pool still holds them all beside it."""
    engine = make_engine("elastic", pool_mib=pool_mib)
    plan = engine.plan
    reserve = plan.activation_reserve_bytes + extra_mib * 2**20
    assert (
        engine.graph_planner.all_experts_fit(plan.budget_bytes, reserve, plan.loading_buffer_bytes)
        is fits
    )
    assert engine.residency.fully_resident() is (pool_mib == 26)


def test_the_plan_prices_the_drivers_memory_above_what_the_h200_measured():
    """The driver's memory per graph is priced, not measured (cuda_graphs.py says why): the
    prices must cover the falls in free memory beyond torch's bytes measured on an H200."""
    mib = 2**20
    assert decode_driver_bytes(35, 24) >= 82 * mib  # qwen1.5: 35 decode graphs
    assert decode_driver_bytes(67, 48) >= 264 * mib  # qwen3: 67 decode graphs
    assert piece_driver_bytes(40, 24) >= 198 * mib  # qwen1.5: 40 sizes x 25 pieces
    assert piece_driver_bytes(32, 48) >= 282 * mib  # qwen3: 32 sizes x 49 pieces
    # and stay within twice that, so the KV cache is not starved for it
    assert decode_driver_bytes(67, 48) <= 2 * 264 * mib
    assert piece_driver_bytes(40, 24) <= 2 * 198 * mib
