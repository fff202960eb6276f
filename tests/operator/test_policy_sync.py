"""Policy sync against a real control plane (gRPC on port 0, its own thread and loop,
so the blocking client is called exactly as the operator's worker thread calls it)."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

from rimuru.controlplane.client import ControlPlaneClient
from rimuru.controlplane.plane import ControlPlane
from rimuru.controlplane.server import create_server
from rimuru.operator.policy_sync import observe_policy, parse_ranking, sync_policy
from rimuru.policy import Tunables

TOKEN = "sync-token"
TUNABLES = Tunables(mode="elastic", expert_offload_limit=4)


@pytest.fixture
def target():
    """A control plane served from a background thread; yields its address."""
    ready = threading.Event()
    state: dict = {}

    async def serve():
        plane = ControlPlane.open(None)  # in memory
        server, port = await create_server("127.0.0.1:0", plane, token=TOKEN)
        await server.start()
        state.update(port=port, stop=asyncio.Event())
        ready.set()
        await state["stop"].wait()
        await server.stop(None)
        plane.close()

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    assert ready.wait(10)
    yield f"127.0.0.1:{state['port']}"
    loop.call_soon_threadsafe(state["stop"].set)
    thread.join(10)


@pytest.fixture
def cp(target):
    with ControlPlaneClient(target, TOKEN, timeout_s=5) as client:
        yield client


def _hotness(order_first: list[int]) -> str:
    layer = {"order": order_first, "prob": [0.5, 0.3, 0.2]}
    return json.dumps({"format": "rimuru.hotness/v1", "layers": [layer, layer]})


def test_first_sync_creates_version_one_and_repeats_are_free(cp):
    policy, digest = sync_policy(cp, "qwen", TUNABLES, None, "", overwrite=True)
    assert (policy.version, policy.tunables, digest) == (1, TUNABLES, "")
    again, _ = sync_policy(cp, "qwen", TUNABLES, None, "", overwrite=True)
    assert again.version == 1  # nothing differs: nothing written


def test_only_a_spec_change_overwrites(cp):
    sync_policy(cp, "qwen", TUNABLES, None, "", overwrite=True)
    tuned = Tunables(mode="elastic", expert_offload_limit=6)
    # The periodic check read an older spec: it must not undo the newer tunables.
    kept, _ = sync_policy(cp, "qwen", tuned, None, "", overwrite=False)
    assert (kept.version, kept.tunables) == (1, TUNABLES)
    changed, _ = sync_policy(cp, "qwen", tuned, None, "", overwrite=True)
    assert (changed.version, changed.tunables) == (2, tuned)


def test_the_periodic_check_restores_a_lost_policy(cp):
    restored, _ = sync_policy(cp, "fresh", TUNABLES, None, "", overwrite=False)
    assert (restored.version, restored.tunables) == (1, TUNABLES)


def test_ranking_uploads_only_when_its_content_changes(cp):
    ranking = parse_ranking("qwen-ranking", "ranking.json", _hotness([2, 0, 1]))
    assert ranking.ranking_id == "configmap/qwen-ranking/ranking.json"
    policy, digest = sync_policy(cp, "qwen", TUNABLES, ranking, "", overwrite=True)
    assert (policy.version, digest) == (2, ranking.digest)  # v1 tunables, v2 + ranking
    assert policy.ranking.digest == ranking.digest
    same, _ = sync_policy(cp, "qwen", TUNABLES, ranking, digest, overwrite=False)
    assert same.version == 2
    edited = parse_ranking("qwen-ranking", "ranking.json", _hotness([1, 2, 0]))
    newer, new_digest = sync_policy(cp, "qwen", TUNABLES, edited, digest, overwrite=False)
    assert (newer.version, new_digest) == (3, edited.digest)
    assert cp.get_ranking("qwen").hotness.order[0] == (1, 2, 0)


def test_observe_reports_versions_without_subscribers(cp):
    sync_policy(cp, "qwen", TUNABLES, None, "", overwrite=True)
    state = observe_policy(cp, "qwen", TUNABLES, "abc")
    assert (state.desired_version, state.applied_version, state.num_subscribers) == (1, 0, 0)
    assert (state.last_error, state.ranking_digest) == ("", "abc")
    assert observe_policy(cp, "unknown", TUNABLES, "").desired_version == 0
    assert not observe_policy(cp, "unknown", TUNABLES, "").spec_pushed


def test_a_spec_change_not_pushed_yet_is_seen(cp):
    """The control plane was down when spec.policy changed: the periodic check never
    overwrites, so until the change handler's retry pushes it the control plane holds the
    old policy. test_apply_and_status checks what the status says of it."""
    sync_policy(cp, "qwen", TUNABLES, None, "", overwrite=True)
    changed = Tunables(mode="elastic", expert_offload_limit=8)
    sync_policy(cp, "qwen", changed, None, "", overwrite=False)
    stale = observe_policy(cp, "qwen", changed, "")
    assert (stale.desired_version, stale.spec_pushed) == (1, False)
    sync_policy(cp, "qwen", changed, None, "", overwrite=True)  # the retry after the outage
    pushed = observe_policy(cp, "qwen", changed, "")
    assert (pushed.desired_version, pushed.spec_pushed) == (2, True)


@pytest.mark.parametrize(
    "text,message",
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "want a JSON object"),
        ('{"format": "other"}', "not a hotness ranking"),
        ('{"format": "rimuru.hotness/v1", "layers": [{"order": [0]}]}', "malformed"),
        (
            '{"format": "rimuru.hotness/v1", "layers": [{"order": [0, 1], "prob": [0.2, 0.8]}]}',
            "non-increasing",
        ),
    ],
)
def test_bad_rankings_name_the_config_map(text, message):
    with pytest.raises(ValueError, match=message) as info:
        parse_ranking("qwen-ranking", "ranking.json", text)
    assert "ConfigMap qwen-ranking key ranking.json" in str(info.value)
