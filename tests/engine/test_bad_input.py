"""Bad input gets an error that says what is wrong, and disturbs nothing."""

import re

import pytest

from rimuru.dataplane.engine.engine import Engine
from rimuru.dataplane.engine.sched.request import MAX_STOP_TOKEN_IDS, SamplingParams
from rimuru.dataplane.engine.startup.config import EngineConfig
from rimuru.policy import Tunables


@pytest.fixture(scope="module")
def engine():
    return Engine(
        EngineConfig(
            activation_reserve=0,
            max_num_batched_tokens=128,
            memory_budget=100 * 2**20,
            max_model_len=4096,
        ),
        log_plan=False,
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_tokens": 0}, "max_tokens must be an integer >= 1"),
        ({"temperature": -1.0}, "temperature must be a finite number >= 0"),
        ({"temperature": float("nan")}, "temperature must be a finite number"),
        ({"top_p": 0.0}, r"top_p must lie in \(0, 1\]"),
        ({"top_k": -5}, "top_k must be -1, 0"),
        ({"seed": -3}, re.escape("seed must be an integer in [0, 2**64 - 1], got -3")),
        (
            {"seed": 2**64},
            re.escape("seed must be an integer in [0, 2**64 - 1], got 18446744073709551616"),
        ),
        (
            {"stop_token_ids": [5, -1]},
            re.escape("stop_token_ids must be token ids (>= 0), got [5, -1]"),
        ),
        (
            {"stop_token_ids": range(MAX_STOP_TOKEN_IDS + 1)},
            f"stop_token_ids must hold at most {MAX_STOP_TOKEN_IDS} ids, got 1025",
        ),
    ],
)
def test_invalid_sampling_parameters(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_a_full_stop_set_ends_the_request_at_its_first_sampled_id(engine):
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    free_run = engine.generate([[5, 6, 7]], params)[0]
    stop = free_run[4]
    unsampled = [t for t in range(1000, 151_936) if t not in free_run]
    stop_ids = (*unsampled[: MAX_STOP_TOKEN_IDS - 1], stop)  # the limit is allowed
    stopped = SamplingParams(max_tokens=10, ignore_eos=True, stop_token_ids=stop_ids)
    assert stopped.stop_token_set == frozenset(stop_ids)
    assert engine.generate([[5, 6, 7]], stopped)[0] == free_run[: free_run.index(stop) + 1]


def test_prompt_longer_than_context(engine):
    with pytest.raises(ValueError, match="exceeds the model's context of 4096 tokens"):
        engine.add_request([1] * 4090, SamplingParams(max_tokens=10))
    with pytest.raises(ValueError) as info:  # no max_tokens >= 1 fits: the prompt must shrink
        engine.add_request([1] * 4096, SamplingParams(max_tokens=1))
    assert str(info.value).endswith(": shorten the prompt to at most 4095 tokens")
    with pytest.raises(ValueError) as info:
        engine.add_request([1] * 4090, SamplingParams(max_tokens=10))
    assert str(info.value).endswith(": shorten the prompt or lower max_tokens to 6")


def test_request_that_can_never_fit_says_what_would(engine):
    fits = engine.max_kv_tokens()
    with pytest.raises(ValueError, match=f"at most {fits} tokens fit"):
        engine.add_request([1] * (fits - 5), SamplingParams(max_tokens=10))


def test_bad_tokens_and_empty_prompt(engine):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.add_request([151936])
    with pytest.raises(ValueError, match="the prompt is empty"):
        engine.add_request([])


def test_rejections_disturb_nothing(engine):
    ok = engine.add_request([5, 6, 7], SamplingParams(max_tokens=3, ignore_eos=True))
    with pytest.raises(ValueError):
        engine.add_request([1] * 5000, SamplingParams(max_tokens=10))
    while engine.has_unfinished_requests():
        engine.step()
    assert len(engine.requests[ok].output_token_ids) == 3
    engine.check_invariants()
    assert engine.num_leaked_pages() == 0


def test_budget_that_cannot_hold_the_weights():
    with pytest.raises(ValueError, match="cannot hold the non-pool weights"):
        Engine(EngineConfig(memory_budget=10 * 2**20, activation_reserve=0), log_plan=False)


def test_abort_frees_pages_and_live_tunables(engine):
    rid = engine.add_request(list(range(10, 60)), SamplingParams(max_tokens=50, ignore_eos=True))
    engine.step()
    assert len(engine.requests[rid].block_table) > 0  # the request holds KV pages now
    assert engine.abort(rid) is True
    assert engine.abort(rid) is False
    engine.check_invariants()
    assert engine.num_leaked_pages() == 0
    with pytest.raises(ValueError, match="changing the memory policy needs a restart"):
        engine.set_tunables(Tunables(mode="resident"))
    engine.set_tunables(Tunables(expert_offload_limit=2))
    assert engine.tunables.expert_offload_limit == 2


def test_request_latencies_are_reported(engine):
    rid = engine.add_request([3, 4, 5, 6], SamplingParams(max_tokens=4, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    r = engine.requests[rid]
    assert r.ttft is not None and r.ttft >= 0
    assert r.tpot is not None and r.tpot >= 0
    assert r.e2e_latency >= r.ttft
    assert len(r.token_times) == 4


def test_tiny_temperature_samples_greedily_instead_of_crashing(engine):
    greedy = engine.generate([[9, 8, 7]], SamplingParams(max_tokens=3, ignore_eos=True))
    tiny = engine.generate(
        [[9, 8, 7]], SamplingParams(max_tokens=3, temperature=1e-40, ignore_eos=True)
    )
    assert tiny == greedy
    engine.check_invariants()


def test_generate_is_all_or_nothing(engine):
    with pytest.raises(ValueError, match="the prompt is empty"):
        engine.generate([[1, 2, 3], [4, 5, 6], []])
    assert not engine.has_unfinished_requests()


def test_offload_limit_beyond_the_loading_buffer_is_refused_and_nothing_changes():
    engine = Engine(
        EngineConfig(
            activation_reserve=0,
            max_num_batched_tokens=128,
            loading_buffer_slots=4,
            tunables=Tunables(expert_offload_limit=4),
        ),
        log_plan=False,
    )
    with pytest.raises(ValueError, match=r"exceeds the loading buffers' 4 slots"):
        engine.set_tunables(Tunables(expert_offload_limit=32))
    assert engine.tunables.expert_offload_limit == 4
    with pytest.raises(ValueError, match="exceeds the loading buffers' 2 slots"):
        Engine(
            EngineConfig(
                activation_reserve=0,
                loading_buffer_slots=2,
                tunables=Tunables(expert_offload_limit=16),
            ),
            log_plan=False,
        )


def test_fixed_policy_needs_a_buffer_for_its_offloaded_experts():
    with pytest.raises(ValueError, match="raise loading_buffer_slots to >= "):
        Engine(
            EngineConfig(
                activation_reserve=0,
                loading_buffer_slots=8,
                tunables=Tunables(mode="fixed"),
                memory_budget=200 * 2**20,
                fixed_expert_share=0.1,
            ),
            log_plan=False,
        )


def test_text_in_text_out_through_the_qwen_tokenizer(engine):
    tokenizer = engine.tokenizer
    assert tokenizer is not None  # tiny borrows Qwen's vocabulary
    assert tokenizer.decode(tokenizer.encode("Hello, wörld!")) == "Hello, wörld!"
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    (text,) = engine.generate_text(["The capital of France is"], params)
    (ids,) = engine.generate([tokenizer.encode("The capital of France is")], params)
    assert text == tokenizer.decode(ids)


@pytest.mark.parametrize("device", ["gpu", "cuda:x", "CPU", "cuda:-1"])
def test_a_device_torch_cannot_name_is_refused_with_the_accepted_forms(device):
    with pytest.raises(ValueError, match=r"device must be cpu, cuda or cuda:N"):
        EngineConfig(device=device)


def test_a_cuda_device_that_is_not_there_is_refused_when_the_engine_starts():
    import torch

    from rimuru.dataplane.engine.engine import Engine

    # A config may name a GPU on a machine without one (the operator checks a GPU pod's
    # arguments anywhere); the engine refuses it before reading any weights.
    if not torch.cuda.is_available():
        config = EngineConfig(device="cuda")
        with pytest.raises(ValueError, match=r"'cuda' needs a CUDA GPU.*use --device cpu"):
            Engine(config)
    else:
        count = torch.cuda.device_count()
        with pytest.raises(ValueError, match=rf"'cuda:{count}' does not exist: {count} GPU"):
            Engine(EngineConfig(device=f"cuda:{count}"))


def test_a_share_of_gpu_memory_on_the_cpu_is_refused_before_any_weights_load():
    # The device defaults to the CPU: a GPU run that forgets --device cuda must not spend
    # minutes generating a large model's weights on the host before it is told.
    with pytest.raises(ValueError, match=r"needs a CUDA device: add --device cuda"):
        EngineConfig(model="qwen3.5-35b-a3b", gpu_memory_utilization=0.9)
    assert EngineConfig(device="cuda", gpu_memory_utilization=0.9).gpu_memory_utilization == 0.9


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("max_model_len", 0, "max_model_len must be >= 1 token, got 0; leave it unset"),
        ("max_model_len", -1, "max_model_len must be >= 1 token, got -1"),
        ("loading_buffer_slots", 0, "loading_buffer_slots must be >= 1 expert, got 0"),
        ("loading_buffer_slots", -1, "loading_buffer_slots must be >= 1 expert, got -1"),
    ],
)
def test_counts_below_one_are_refused_not_reinterpreted(field, value, message):
    """0 used to mean the default and -1 one slot: refused, with what unset means."""
    with pytest.raises(ValueError, match=message):
        EngineConfig(**{field: value})


def test_a_context_past_the_models_positions_is_refused_not_cut():
    with pytest.raises(ValueError) as info:
        Engine(EngineConfig(model="tiny", max_model_len=32769))
    assert str(info.value) == (
        "max_model_len=32769 exceeds the model's context of 32768 tokens: give at most that, "
        "or leave it unset"
    )
    assert (
        Engine(EngineConfig(model="tiny", max_model_len=32768), log_plan=False).max_model_len
        == 32768
    )
