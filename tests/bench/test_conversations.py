"""Multi-turn chat as a closed loop (dataplane/bench/conversations.py), on the tiny engine."""

from __future__ import annotations

import pytest

from rimuru.dataplane.bench.conversations import conversations_of, run_conversations
from rimuru.dataplane.bench.trace import Trace, TraceRequest
from rimuru.dataplane.engine.engine import Engine
from rimuru.dataplane.engine.startup.config import EngineConfig
from rimuru.policy import Tunables


def _trace(lens: list[tuple[int, int]]) -> Trace:
    requests = [
        TraceRequest(tuple(range(100 * i + 1, 100 * i + 1 + p)), o) for i, (p, o) in enumerate(lens)
    ]
    return Trace("t", requests)


def test_turns_are_consecutive_requests_and_a_short_last_group_is_dropped():
    trace = _trace([(5, 3)] * 7)
    chats = conversations_of(trace, 3)
    assert [c.turns for c in chats] == [trace.requests[0:3], trace.requests[3:6]]
    with pytest.raises(ValueError, match="a conversation of 1 turns: give 2 or more"):
        conversations_of(trace, 1)
    with pytest.raises(ValueError, match="7 requests make no conversation of 8 turns"):
        conversations_of(trace, 8)


def test_each_turn_resends_the_history_with_the_model_s_answers_once_the_last_is_done():
    engine = Engine(
        EngineConfig(activation_reserve=0, tunables=Tunables(mode="resident")), log_plan=False
    )
    trace = _trace([(6, 4), (5, 3), (7, 2), (4, 5), (3, 2), (9, 3)])
    result = run_conversations(engine, conversations_of(trace, 3), num_clients=2, progress=False)
    requests = [engine.requests[f"resident-{i}"] for i in range(6)]
    # two clients: chats A (requests 0-2) and B (3-5) interleave, each turn after the last
    by_chat: dict[int, list] = {}
    for r in requests:
        first_user = r.prompt_token_ids[0] // 100
        by_chat.setdefault(first_user, []).append(r)
    assert sorted(by_chat) == [0, 3]
    for first, turns in by_chat.items():
        history: list[int] = []
        for k, r in enumerate(turns):
            user = list(trace.requests[first + k].prompt_token_ids)
            assert list(r.prompt_token_ids) == history + user
            assert len(r.output_token_ids) == trace.requests[first + k].output_len
            history = history + user + list(r.output_token_ids)
            if k:  # sent once the answer before it was complete
                assert r.arrival_time >= turns[k - 1].finish_time
    assert result.request_metrics.num_completed == 6
    assert result.config["num_clients"] == 2 and result.config["conversations_cut_short"] == 0
    assert engine.num_leaked_pages() == 0


def test_a_conversation_that_would_outgrow_the_context_ends_early():
    engine = Engine(
        EngineConfig(activation_reserve=0, max_model_len=24, tunables=Tunables(mode="resident")),
        log_plan=False,
    )
    trace = _trace([(8, 4), (8, 4), (8, 4)])  # turn 2 would need 8+4+8+4+8+4 = 36 > 24
    result = run_conversations(engine, conversations_of(trace, 3), num_clients=1, progress=False)
    assert result.request_metrics.num_completed == 2
    assert result.config["conversations_cut_short"] == 1
