"""Steps with prompt chunks through the piecewise-graph inputs (static buffers, tokens padded
to a capture size, attention eager between the pieces) give the eager engine's tokens and
routing statistics.

A CPU cannot capture, so the pieces run over their static inputs eagerly here
(capture=False); bench/gpu_checks.py compares captured replays with eager steps on the GPU."""

import pytest
import torch

from rimuru.dataplane.engine.graphs.graph_setup import GraphPlan, graph_memory_plan
from rimuru.dataplane.engine.graphs.piecewise_graphs import piecewise_sizes
from rimuru.dataplane.engine.sched.request import SamplingParams
from rimuru.dataplane.engine.startup.config import EngineConfig


def test_piecewise_sizes_cover_every_step_up_to_max_num_batched_tokens():
    sizes = piecewise_sizes(2048)
    assert sizes[:3] == (16, 32, 48) and sizes[-1] == 2048
    assert {256, 288, 512, 576, 1024, 1152} <= set(sizes) and 272 not in sizes
    assert len(sizes) == 16 + 8 + 8 + 8
    assert piecewise_sizes(100) == (16, 32, 48, 64, 80, 96, 100)
    assert piecewise_sizes(5) == (5,)
    assert piecewise_sizes(300)[-3:] == (256, 288, 300)
    for n in range(1, 2049):  # padding: under 16 tokens, or under 1/8 of the step
        pad = next(s for s in sizes if s >= n) - n
        assert pad < 16 or pad < n / 8, n


def _piecewise_engine(make_engine, mode, **overrides):
    engine = make_engine(mode, **overrides)
    engine.make_cuda_graphs(capture=False)
    assert engine.cuda_graphs.piecewise is not None
    return engine


@pytest.mark.parametrize("mode", ["resident", "elastic"])
def test_prompt_steps_through_the_pieces_give_the_eager_tokens_and_counts(
    prompts, make_engine, mode
):
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    eager = make_engine(mode)
    want = eager.generate(prompts, params)
    engine = _piecewise_engine(make_engine, mode)
    got = engine.generate(prompts, params)
    assert got == want
    pw, decode = engine.cuda_graphs.piecewise, engine.cuda_graphs.decode
    # every step went through static inputs: prompt steps the pieces, decode-only the graphs
    assert pw.steps > 0
    assert pw.steps + decode.steps == len(engine.stats)
    # padding tokens were routed but not counted
    assert torch.equal(engine.moe_backend.routing_counts, eager.moe_backend.routing_counts)
    if mode == "elastic":  # the tight pool made it move the boundary while prompts ran
        assert engine.expert_counters.evictions > 0
    engine.check_invariants()
    assert engine.num_leaked_pages() == 0


def test_attention_sees_only_the_real_tokens(prompts, make_engine):
    """A step of 37 tokens pads to 48 for the pieces; the KV write and attention between
    them take the 37 real ones, whose output lands in the first 37 rows."""
    engine = _piecewise_engine(make_engine, "resident")
    pw = engine.cuda_graphs.piecewise
    assert pw.size_for(37) == 48
    seen, attend = [], engine.attention.attend

    def recording(layer, q, k, v, meta):
        seen.append((layer, q.shape[0], k.shape[0], v.shape[0]))
        return attend(layer, q, k, v, meta)

    engine.attention.attend = recording
    want = make_engine("resident").generate([prompts[0][:37]], SamplingParams(max_tokens=1))
    pw.attn.fill_(1e4)  # stale rows from an earlier step: padding reads them as they are
    assert engine.generate([prompts[0][:37]], SamplingParams(max_tokens=1)) == want
    layers = engine.model_config.num_layers
    assert pw.steps == 1 and seen == [(layer, 37, 37, 37) for layer in range(layers)]
    assert bool((pw.attn[37:48] == 1e4).all())  # padding rows were never written


def test_a_prompt_step_with_an_offloaded_expert_runs_eagerly_under_host_copies(
    prompts, make_engine
):
    """serves() asks the experts: with host copies, an offloaded expert needs the host's
    decision, which no graph can hold."""
    engine = _piecewise_engine(make_engine, "resident", expert_copy="host")
    pw = engine.cuda_graphs.piecewise
    engine.add_request(prompts[0], SamplingParams(max_tokens=4, ignore_eos=True))
    engine.step()  # the prompt, every expert resident: the pieces
    assert pw.steps == 1
    engine.residency.evict(0, 0, last_step=engine.step_id)
    engine.add_request(prompts[1], SamplingParams(max_tokens=4, ignore_eos=True))
    engine.step()  # a prompt step, an expert of layer 0 off the device: eager
    assert pw.steps == 1 and not pw.serves(40)


def test_graph_memory_plan_drops_the_pieces_before_the_decode_graphs():
    room = {"bytes": 0}

    def fits(extra: int) -> bool:
        return extra <= room["bytes"]

    assert graph_memory_plan(100, 50, None) == GraphPlan(150, True)  # device copy-in: no test
    assert graph_memory_plan(100, 0, None) == GraphPlan(100, False)
    room["bytes"] = 150
    assert graph_memory_plan(100, 50, fits) == GraphPlan(150, True)
    room["bytes"] = 149  # both do not fit: the decode graphs alone
    assert graph_memory_plan(100, 50, fits) == GraphPlan(100, False)
    room["bytes"] = 99  # not even those
    assert graph_memory_plan(100, 50, fits) == GraphPlan(0, False)


def test_host_copies_with_offloading_policies_keep_prompt_steps_eager(make_engine):
    # an offloaded expert would make such a step eager: then the pieces' memory would sit
    # beside the activation reserve, so those engines do not make them
    engine = make_engine("elastic", expert_copy="host")
    engine.make_cuda_graphs(capture=False)
    assert engine.cuda_graphs.decode is not None and engine.cuda_graphs.piecewise is None
    resident = make_engine("resident", expert_copy="host")
    resident.make_cuda_graphs(capture=False)
    assert resident.cuda_graphs.piecewise is not None


def test_full_decode_only_keeps_prompt_steps_eager(make_engine):
    engine = make_engine("resident", cudagraph_mode="full_decode_only")
    engine.make_cuda_graphs(capture=False)
    assert engine.cuda_graphs.decode is not None and engine.cuda_graphs.piecewise is None


def test_cudagraph_mode_is_validated():
    with pytest.raises(ValueError, match="cudagraph_mode must be one of full_and_piecewise"):
        EngineConfig(cudagraph_mode="piecewise")
