"""Multi-turn chat as a closed loop: the workload prefix caching serves.

A conversation is `turns` consecutive requests of a trace, each a user turn (its prompt
tokens) and the length of the answer to it. Turn k's prompt is the conversation so far:
turn 0's prompt, the model's answer to it, turn 1's prompt, ..., turn k's prompt, so every
turn resends the whole history, as a chat client does. `num_clients` conversations run at
once; a client sends its next turn the moment the answer to the last one is complete (no
think time) and takes the next conversation when its own ends. A conversation whose next
turn would not fit the model's context ends early (counted in the results' config).

The turns are ShareGPT first turns in trace order, not one ShareGPT conversation's own
turns: the lengths follow ShareGPT's, and what prefix caching meets (a growing history
resent each turn) is the same.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from rimuru.dataplane.bench.progress import RequestProgress
from rimuru.dataplane.bench.results import BenchResult
from rimuru.dataplane.bench.runner import collect_result
from rimuru.dataplane.bench.sampling import bench_params
from rimuru.dataplane.bench.trace import Trace, TraceRequest
from rimuru.dataplane.engine.engine import Engine


@dataclass(frozen=True)
class Conversation:
    turns: tuple[TraceRequest, ...]  # each user turn's tokens and its answer's length


def conversations_of(trace: Trace, turns: int) -> list[Conversation]:
    """The trace's requests, `turns` at a time, in trace order (a last, shorter group is
    dropped, so every conversation has `turns` turns)."""
    if turns < 2:
        raise ValueError(f"a conversation of {turns} turns: give 2 or more")
    if len(trace) < turns:
        raise ValueError(
            f"{len(trace)} requests make no conversation of {turns} turns: raise --num-prompts"
        )
    whole = len(trace) // turns * turns
    return [Conversation(trace.requests[i : i + turns]) for i in range(0, whole, turns)]


class _Client:
    """One conversation in flight: its history so far and the turn being answered."""

    def __init__(self, conversation: Conversation):
        self.conversation = conversation
        self.history: tuple[int, ...] = ()
        self.turn = 0
        self.request_id: str | None = None

    def next_prompt(self) -> tuple[int, ...]:
        return self.history + self.conversation.turns[self.turn].prompt_token_ids


def run_conversations(
    engine: Engine,
    conversations: list[Conversation],
    num_clients: int,
    progress: bool = True,
    desc: str = "",
    clock: Callable[[], float] = time.monotonic,
    temperature: float = 0.0,
) -> BenchResult:
    if num_clients < 1:
        raise ValueError(f"--num-clients must be at least 1; got {num_clients}")
    start = clock()
    first_step = engine.step_id
    resident_at_start = engine.residency.num_resident()
    queue = list(reversed(conversations))
    clients: list[_Client] = []
    ids: list[str] = []
    cut_short = 0
    total = sum(len(c.turns) for c in conversations)

    def send(client: _Client) -> None:
        turn = client.conversation.turns[client.turn]
        prompt = client.next_prompt()
        client.request_id = engine.add_request(
            list(prompt),
            bench_params(turn.output_len, len(ids), temperature),
            request_id=f"{engine.tunables.mode}-{len(ids)}",
            arrival_time=clock(),
        )
        ids.append(client.request_id)

    def fits(client: _Client) -> bool:
        turn = client.conversation.turns[client.turn]
        return len(client.next_prompt()) + turn.output_len <= engine.max_model_len

    def start_next() -> None:
        nonlocal cut_short
        while queue and len(clients) < num_clients:
            client = _Client(queue.pop())
            if fits(client):
                clients.append(client)
                send(client)
            else:
                cut_short += 1

    with RequestProgress(
        total, desc=desc or engine.tunables.mode, disable=None if progress else True
    ) as bar:
        start_next()
        while clients:
            engine.step()
            for client in list(clients):
                request = engine.requests[client.request_id]
                if not request.status.finished:
                    continue
                client.history = client.next_prompt() + tuple(request.output_token_ids)
                client.turn += 1
                if client.turn < len(client.conversation.turns) and fits(client):
                    send(client)
                    continue
                if client.turn < len(client.conversation.turns):
                    cut_short += 1
                clients.remove(client)
                start_next()
            done = sum(1 for i in ids if engine.requests[i].status.finished)
            bar.advance_to(
                done, running=len(engine.scheduler.running), waiting=len(engine.scheduler.waiting)
            )
    return collect_result(
        engine,
        ids,
        start,
        clock() - start,
        first_step,
        resident_at_start,
        float("inf"),  # a closed loop: each turn is sent when the last answer is complete
        conversations=len(conversations),
        turns_per_conversation=max((len(c.turns) for c in conversations), default=0),
        num_clients=num_clients,
        conversations_cut_short=cut_short,
    )
