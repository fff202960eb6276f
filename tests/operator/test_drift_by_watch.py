"""Drift is undone as soon as the watch reports it, not at the next period: with a status
interval far longer than the test, a deleted data-plane Deployment is created again and a
hand edit of its image is undone, and the Deployment controller's status report reaches
the RimuruDeployment's status."""

from __future__ import annotations

from tests.operator import operator_harness as harness


def _dataplane(kmock) -> dict | None:
    return harness.obj(kmock, harness.DEPLOYMENTS, "tiny-dataplane")


def _image(kmock) -> str:
    return _dataplane(kmock)["spec"]["template"]["spec"]["containers"][0]["image"]


def _status(kmock) -> dict:
    return harness.obj(kmock, harness.RD, "tiny")["status"]


async def test_a_child_change_is_acted_on_without_waiting_for_the_period(
    kmock,
    env,
    tiny_rd,
    monkeypatch,
):
    monkeypatch.setenv("RIMURU_OPERATOR_STATUS_INTERVAL_SECONDS", "3600")
    http = env
    path = f"/apis/apps/v1/namespaces/{harness.NS}/deployments/tiny-dataplane"
    async with harness.operator_running() as runner:
        await harness.create_tiny(http, tiny_rd)
        await harness.eventually(lambda: _dataplane(kmock), what="data plane")
        # The change handler is done (nothing blocks it, so it is not retried) ...
        await harness.emulate_rollout(http, "tiny-controlplane", 1)
        await harness.eventually(
            lambda: _status(kmock)["policy"]["desiredVersion"] == 1, what="policy pushed"
        )
        # ... so from here only the watch of the children can make the operator act.
        await harness.emulate_rollout(http, "tiny-dataplane", 1)
        await harness.eventually(
            lambda: _status(kmock)["readyReplicas"] == 1, timeout=5, what="ready replicas"
        )

        edit = {"spec": {"template": {"spec": {"containers": [
            {"name": "dataplane", "image": "someone/else:1"}
        ]}}}}  # fmt: skip
        await harness._call(http, "PATCH", path, edit, "application/merge-patch+json")
        await harness.eventually(lambda: _image(kmock) == "reg/dp:e2e", timeout=5, what="restored")

        await harness._call(http, "DELETE", path)
        await harness.eventually(lambda: _dataplane(kmock), timeout=5, what="created again")
        await harness.deleted(kmock, http)
    assert runner.exception is None


async def test_a_child_that_lost_the_watched_label_is_labelled_again(
    kmock,
    env,
    tiny_rd,
):
    """The watch selects the children by app.kubernetes.io/managed-by; one whose label was
    removed by hand vanishes from it, so the next pass's create meets a 409: it is read
    from the server and patched back into view."""
    http = env
    path = f"/apis/apps/v1/namespaces/{harness.NS}/deployments/tiny-dataplane"
    managed = "app.kubernetes.io/managed-by"
    async with harness.operator_running() as runner:
        await harness.create_tiny(http, tiny_rd)
        await harness.eventually(lambda: _dataplane(kmock), what="data plane")
        unlabel = {"metadata": {"labels": {managed: None}}}
        await harness._call(http, "PATCH", path, unlabel, "application/merge-patch+json")
        await harness.eventually(
            lambda: _dataplane(kmock)["metadata"]["labels"].get(managed) == "rimuru-operator",
            timeout=5,
            what="label restored",
        )
        await harness.deleted(kmock, http)
    assert runner.exception is None
