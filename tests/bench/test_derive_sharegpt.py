"""The trace derivation logic on a tiny ShareGPT-like file, with a stand-in tokenizer."""

from __future__ import annotations

import json
import random

import pytest

from rimuru.dataplane.bench.trace import Trace, TraceRequest


def words(text: str) -> list[int]:
    """Stand-in tokenizer: one token per word, the id is the word's length."""
    return [len(w) for w in text.split()]


def text(num_tokens: int) -> str:
    return " ".join(["abc"] * num_tokens)


def record(i: int, *turns: str) -> dict:
    roles = ("human", "gpt")
    return {
        "id": f"r{i}",
        "conversations": [{"from": roles[j % 2], "value": t} for j, t in enumerate(turns)],
    }


def sharegpt_json(records: list[dict], cut_tail: bool) -> str:
    body = json.dumps(records, indent=2)
    if not cut_tail:
        return body
    # Cut the file inside one more record, as the packaged copy is cut.
    extra = json.dumps(record(999, text(5), text(5)), indent=2)
    return body[:-2] + ",\n" + extra[: len(extra) // 2]


def test_decode_stops_at_the_broken_tail(derive):
    records = [record(i, text(5), text(6)) for i in range(7)]
    whole = derive.decode_records(sharegpt_json(records, cut_tail=False))
    cut = derive.decode_records(sharegpt_json(records, cut_tail=True))
    assert whole.records == records and whole.num_tail_chars == 0
    assert cut.records == records and cut.num_tail_chars > 0


def test_decode_rejects_a_non_array(derive):
    with pytest.raises(ValueError, match="JSON array"):
        derive.decode_records('{"id": 1}')


def test_shuffle_is_vllms_global_seed_zero_shuffle(derive):
    records = [record(i, f"p{i}", f"c{i}") for i in range(50)]
    records.insert(3, record(100, "only one turn"))
    records.insert(9, record(101))
    expected = [(f"p{i}", f"c{i}") for i in range(50)]
    state = random.getstate()
    try:
        random.seed(0)
        random.shuffle(expected)
    finally:
        random.setstate(state)
    assert derive.shuffled_pairs(records) == expected


def test_length_rules_at_their_boundaries(derive):
    pairs = [
        (text(3), text(10)),  # prompt < 4: dropped
        (text(10), text(3)),  # output < 4: dropped
        (text(4), text(4)),  # both exactly 4: kept
        (text(1025), text(4)),  # prompt > 1024: dropped
        (text(1024), text(1024)),  # prompt 1024, total 2048: kept
        (text(1000), text(1049)),  # total 2049: dropped
        (text(7), text(9)),
        (text(8), text(9)),  # not reached: 3 requests asked for
    ]
    sample = derive.sample_requests(pairs, words, num_requests=3)
    assert [(r.prompt_len, r.output_len) for r in sample.requests] == [(4, 4), (1024, 1024), (7, 9)]
    assert sample.requests[0].prompt_token_ids == (3, 3, 3, 3)
    assert sample.num_pairs_examined == 7


def test_too_few_pairs_is_an_error_saying_how_many_fit(derive):
    with pytest.raises(ValueError, match="ask for at most 1"):
        derive.sample_requests([(text(5), text(5)), (text(2), text(5))], words, num_requests=2)


def test_derive_end_to_end_records_metadata(derive):
    records = [record(i, text(4 + i), text(4 + 2 * i)) for i in range(30)]
    records.append(record(30, text(9)))
    trace = derive.derive(sharegpt_json(records, cut_tail=True), words, 10, {"file": "x.json"})
    assert trace.name == "sharegpt_qwen_10"
    assert len(trace) == 10
    source = trace.metadata["source"]
    assert source["num_records_decoded"] == 31
    assert source["num_conversations_2plus_turns"] == 30
    assert source["num_pairs_examined"] == 10
    assert source["num_tail_chars_dropped"] > 0
    assert trace.metadata["seed"] == 0
    assert trace.metadata["rules"]["max_total_len"] == 2048
    # Request k is conversation i: prompt 4 + i tokens, output 4 + 2i.
    assert all(r.output_len == 2 * r.prompt_len - 4 for r in trace.requests)


def test_capped_cuts_prompts_and_outputs(derive):
    full = Trace(
        "full",
        [TraceRequest(tuple(range(1, 11)), 20), TraceRequest((5, 6, 7), 2), TraceRequest((1,), 9)],
        {"seed": 0, "num_requests": 3},
    )
    cpu = derive.capped(full, "cpu", num_requests=2, max_prompt=4, max_output=8)
    assert cpu.requests == (TraceRequest((1, 2, 3, 4), 8), TraceRequest((5, 6, 7), 2))
    assert cpu.metadata["caps"]["max_prompt_len"] == 4
    assert cpu.metadata["num_requests"] == 2
    assert cpu.metadata["derived_from"] == "full"
