"""The domain objects without gRPC: tunables rules, rankings, the xDS state machine."""

from __future__ import annotations

import asyncio
import hashlib

import pytest

from rimuru.controlplane.errors import AlreadyExists, InvalidArgument
from rimuru.controlplane.policy import Policy
from rimuru.controlplane.subscribers import Answer, SubscriberRegistry
from rimuru.policy import HotnessRanking, InvalidPolicy, Tunables, check_pushable
from rimuru.policy_proto import ranking_from_layers
from rimuru.v1 import control_pb2 as pb


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"mode": "lazy"}, "tunables.mode"),
        ({"expert_offload_limit": -1}, "tunables.expert_offload_limit"),
        ({"expert_offload_limit": 2**31}, "tunables.expert_offload_limit"),
        ({"shrink_threshold": 9}, "tunables.grow_threshold"),
        ({"max_grow_per_round": 0}, "tunables.max_grow_per_round"),
        ({"online_hotness": 1}, "tunables.online_hotness"),
        ({"copy_budget": -0.5}, "tunables.copy_budget"),
        ({"copy_budget": float("nan")}, "tunables.copy_budget"),
        ({"copy_budget": float("inf")}, "tunables.copy_budget"),
        ({"copy_budget": True}, "tunables.copy_budget"),
        ({"mode": "fixed", "copy_budget": 1.0}, "tunables.copy_budget"),
    ],
)
def test_tunables_rules(kwargs, field):
    with pytest.raises(InvalidPolicy) as info:
        Tunables(**kwargs)
    assert info.value.field == field


def test_a_pushed_resident_policy_offloads_nothing():
    # The data plane ignores the limit in mode resident; the control plane refuses to
    # store one, so a policy never claims an offload that cannot happen.
    assert Tunables(mode="resident").expert_offload_limit == 8
    with pytest.raises(InvalidPolicy) as info:
        check_pushable(Tunables(mode="resident"))
    assert info.value.field == "tunables.expert_offload_limit"
    assert check_pushable(Tunables(mode="resident", expert_offload_limit=0)).mode == "resident"


def test_defaults_are_valid_and_match_the_data_plane():
    t = Tunables()
    assert (t.mode, t.expert_offload_limit, t.shrink_threshold, t.grow_threshold) == (
        "elastic",
        8,
        2,
        9,
    )
    assert (t.max_grow_per_round, t.online_hotness) == (5, False)
    assert t.copy_budget == 0.0
    assert Tunables(mode="resident", expert_offload_limit=0).mode == "resident"


def test_digest_ignores_layer_order_on_the_wire_but_not_content():
    a = [
        pb.LayerRanking(layer=0, expert_ids=[1, 0], probabilities=[0.6, 0.4]),
        pb.LayerRanking(layer=1, expert_ids=[0, 1], probabilities=[0.5, 0.5]),
    ]
    digest = ranking_from_layers(a).digest()
    assert digest == ranking_from_layers(list(reversed(a))).digest()
    # The stored digests (RankingRef.digest) were made from this canonical form.
    canonical = b"[[0,[1,0],[0.6,0.4]],[1,[0,1],[0.5,0.5]]]"
    assert digest == hashlib.sha256(canonical).hexdigest()
    other = HotnessRanking(((1, 0), (1, 0)), ((0.6, 0.4), (0.5, 0.5)))
    assert other.digest() != digest


def test_reads_the_data_planes_ranking_file_format():
    data = {
        "format": "rimuru.hotness/v1",
        "num_layers": 2,
        "num_experts": 2,
        "layers": [{"order": [1, 0], "prob": [0.7, 0.3]}, {"order": [0, 1], "prob": [0.5, 0.5]}],
    }
    assert HotnessRanking.from_json(data) == HotnessRanking(
        ((1, 0), (0, 1)), ((0.7, 0.3), (0.5, 0.5))
    )
    with pytest.raises(ValueError, match="not a hotness ranking"):
        HotnessRanking.from_json({"format": "other"})


async def test_watch_state_machine():
    clock = iter(range(100))
    registry = SubscriberRegistry(clock=lambda: float(next(clock)))
    current: dict[str, Policy] = {"qwen": Policy("qwen", 1, Tunables())}
    watch = registry.open_watch("pod", "qwen", 0, current.get)
    policy, nonce = await watch.next_push()
    assert policy.version == 1
    assert watch.answer(1, "other", "") is Answer.STALE
    assert watch.answer(1, nonce, "") is Answer.ACK
    assert watch.answer(1, nonce, "") is Answer.STALE  # answered already

    # Nothing newer: next_push waits until notify; a version is pushed once.
    waiting = asyncio.create_task(watch.next_push())
    await asyncio.sleep(0)
    assert not waiting.done()
    current["qwen"] = Policy("qwen", 2, Tunables(expert_offload_limit=1))
    registry.notify("qwen")
    policy, nonce = await asyncio.wait_for(waiting, 1)
    assert policy.version == 2
    assert watch.answer(1, nonce, "too big") is Answer.NACK
    (view,) = registry.list("qwen")
    assert (view.applied_version, view.pushed_version, view.last_nacked_version) == (1, 2, 2)
    assert view.last_error == "too big" and view.connected

    # A second watch of a connected node id is refused; once the first closes, a
    # reconnect takes the record over and the old watch's answers are stale.
    with pytest.raises(AlreadyExists):
        registry.open_watch("pod", "qwen", 1, current.get)
    watch.close()
    newer = registry.open_watch("pod", "qwen", 1, current.get)
    assert await asyncio.wait_for(watch.next_push(), 1) is None
    assert watch.answer(2, nonce, "") is Answer.STALE
    assert (await newer.next_push())[0].version == 2  # 2 is newer than the 1 it runs
    watch.close()  # the old stream's close again does not mark the node disconnected
    assert registry.list("qwen")[0].connected
    newer.close()
    assert not registry.list("qwen")[0].connected
    with pytest.raises(InvalidArgument):
        registry.open_watch("", "qwen", 0, current.get)
