"""What one settled RimuruDeployment costs the API server: every request the operator
makes in a window after its status has settled, counted against the emulated API server
(docs/benchmarks.md's measurement, at a 0.3 s status interval). The operator reads its
Deployments, Services and disruption budgets (and the data-plane pods) from watches that
the API server filters to its own objects, keeps the token it read, and writes status only
when it changes."""

from __future__ import annotations

import asyncio
import collections
import time

from tests.operator import operator_harness as harness

WINDOW_S = 10.0


def operator_requests(kmock, since: int = 0) -> collections.Counter:
    """(method, resource) of the operator's requests from the `since`th on (the test's
    own carry no token)."""
    counts: collections.Counter = collections.Counter()
    for request in list(kmock)[since:]:
        if request.resource is None or "Authorization" not in request.headers:
            continue
        resource = request.resource.plural or "discovery"
        if request.subresource:
            resource += f"/{request.subresource}"
        action = request.action.value if request.action is not None else request.method.value
        counts[action, resource] += 1
    return counts


async def _status_writes_stop(kmock, quiet_s: float = 2.0, limit_s: float = 60.0) -> None:
    """Until no status write came for `quiet_s` (a fixed sleep flakes on a loaded machine)."""
    started = last_change = time.monotonic()
    seen = -1
    while time.monotonic() - started < limit_s:
        writes = operator_requests(kmock, 0)["UPDATE", "rimurudeployments/status"]
        if writes != seen:
            seen, last_change = writes, time.monotonic()
        elif time.monotonic() - last_change >= quiet_s:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"status writes never stopped in {limit_s:.0f} s")


async def test_a_settled_deployment_costs_no_reads_of_watched_children(
    kmock,
    env,
    tiny_rd,
    monkeypatch,
):
    monkeypatch.setenv("RIMURU_OPERATOR_STATUS_INTERVAL_SECONDS", "0.3")
    http = env
    async with harness.operator_running() as runner:
        await harness.rolled_out_tiny(kmock, http, tiny_rd)
        await _status_writes_stop(kmock)  # the last status write of the rollout lands
        since = len(list(kmock))
        await asyncio.sleep(WINDOW_S)
        counts = operator_requests(kmock, since)
        await harness.deleted(kmock, http)
    assert runner.exception is None
    # (after the runner: it holds sys.stdout while it runs)
    print(f"operator requests in {WINDOW_S:.0f} s at a 0.3 s interval:", dict(counts))
    # The children's lists and watches are filtered by the API server, not the operator.
    watched = {"deployments", "services", "poddisruptionbudgets", "pods"}
    selectors = {
        (request.resource.plural, request.params.get("labelSelector"))
        for request in kmock
        if request.resource is not None
        and request.resource.plural in watched
        and request.action is not None
        and request.action.value in ("LIST", "WATCH")
        and "Authorization" in request.headers
    }
    assert selectors == {
        (plural, "app.kubernetes.io/managed-by=rimuru-operator") for plural in watched
    }
    # The Deployments as stored carry the API server's defaults (the emulator's too): not
    # drift, so nothing is patched back.
    assert counts["UPDATE", "deployments"] == 0
    assert counts["FETCH", "deployments"] == 0
    assert counts["FETCH", "services"] == 0
    assert counts["FETCH", "secrets"] == 0
    assert counts["UPDATE", "rimurudeployments/status"] == 0  # nothing changed
    # the engine ConfigMap is still read each interval (ConfigMaps are not watched)
    assert counts["FETCH", "configmaps"] <= WINDOW_S / 0.3 + 1
