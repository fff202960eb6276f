"""Why a model does not load, in status: a data-plane pod in CrashLoopBackOff puts the
engine's last log lines (its FallbackToLogsOnError termination message) in Degraded, reason
DataPlaneFailing; an image that cannot be pulled says so; a pod that is merely starting
says nothing. Against the emulated API server, the kubelet's report is written by the test."""

from __future__ import annotations

import copy

from rimuru.operator.builders import build_dataplane_deployment
from rimuru.operator.config import OperatorConfig
from rimuru.operator.pod_failures import MAX_MESSAGE_CHARS, pod_failure
from rimuru.operator.spec import parse_spec
from tests.operator import operator_harness as harness
from tests.operator.test_apply_and_status import _obs, _status

TRACEBACK = "Traceback (most recent call last):\n...\nFileNotFoundError: /models/qwen/config.json"
LABELS = {
    "app.kubernetes.io/name": "rimuru",
    "app.kubernetes.io/instance": "tiny",
    "app.kubernetes.io/component": "dataplane",
    "app.kubernetes.io/part-of": "rimuru",
    "app.kubernetes.io/managed-by": "rimuru-operator",
}


def _pod(name: str, state: dict, last_state: dict | None = None) -> dict:
    container = {"name": "dataplane", "ready": False, "restartCount": 3, "state": state}
    if last_state is not None:
        container["lastState"] = last_state
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": harness.NS, "labels": LABELS},
        "spec": {"containers": [{"name": "dataplane", "image": "reg/dp:e2e"}]},
        "status": {"phase": "Running", "containerStatuses": [container]},
    }


CRASHING = _pod(
    "tiny-dataplane-abc-1",
    {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting"}},
    {"terminated": {"exitCode": 1, "reason": "Error", "message": TRACEBACK}},
)
NO_IMAGE = _pod(
    "tiny-dataplane-abc-2",
    {"waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "reg/dp:x"'}},
)
STARTING = _pod("tiny-dataplane-abc-3", {"waiting": {"reason": "ContainerCreating"}})


def test_the_failing_pods_story():
    assert pod_failure([]) is None
    assert pod_failure([STARTING]) is None
    assert pod_failure([STARTING, NO_IMAGE]) == (
        'pod tiny-dataplane-abc-2: ImagePullBackOff: Back-off pulling image "reg/dp:x"'
    )
    crash = pod_failure([NO_IMAGE, CRASHING])  # the first by name
    assert (
        crash
        == f"pod tiny-dataplane-abc-1: CrashLoopBackOff; last exit code 1 (Error): {TRACEBACK}"
    )
    long = _pod("p", CRASHING["status"]["containerStatuses"][0]["state"],
                {"terminated": {"exitCode": 137, "reason": "OOMKilled", "message": "x" * 9000}})  # fmt: skip
    assert pod_failure([long]).endswith("x" * MAX_MESSAGE_CHARS)
    assert len(pod_failure([long])) < MAX_MESSAGE_CHARS + 100


def test_a_crash_loop_stays_failing_while_the_container_runs_between_back_offs():
    """Restarted, the engine loads its model for minutes before it fails again: the pod is
    Running and not ready then, and the loop must still read as failing (no flapping)."""
    crashed = CRASHING["status"]["containerStatuses"][0]["lastState"]
    loading = _pod("tiny-dataplane-abc-1", {"running": {"startedAt": "now"}}, crashed)
    assert pod_failure([loading]) == (
        "pod tiny-dataplane-abc-1: restarted 3 times, loading; last exit code 1 (Error): "
        + TRACEBACK
    )
    # a first start, a clean restart, or a ready container is not a failure
    first = _pod("a", {"running": {}})
    first["status"]["containerStatuses"][0]["restartCount"] = 0
    clean = _pod("b", {"running": {}}, {"terminated": {"exitCode": 0, "reason": "Completed"}})
    ready = copy.deepcopy(loading)
    ready["status"]["containerStatuses"][0]["ready"] = True
    assert pod_failure([first, clean, ready]) is None


def test_a_failing_data_plane_degrades_the_status():
    status = _status(_obs(dataplane_failure="pod p: CrashLoopBackOff"))
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "DataPlaneFailing")
    assert status["phase"] == "Degraded"


def test_the_engines_last_log_lines_become_the_termination_message(tiny_rd):
    spec = parse_spec(tiny_rd["metadata"], tiny_rd["spec"])
    deployment = build_dataplane_deployment(spec, OperatorConfig())
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"


async def test_the_operator_reports_why_the_model_does_not_load(kmock, env, tiny_rd):
    http = env
    pods = f"/api/v1/namespaces/{harness.NS}/pods"
    async with harness.operator_running() as runner:
        await harness.create_tiny(http, tiny_rd)
        await harness.eventually(
            lambda: harness.obj(kmock, harness.DEPLOYMENTS, "tiny-dataplane"), what="dp"
        )
        await harness._call(http, "POST", pods, CRASHING)  # the kubelet's report

        def degraded():
            c = harness.condition(harness.obj(kmock, harness.RD, "tiny"), "Degraded")
            return c if c["reason"] == "DataPlaneFailing" else None

        reported = await harness.eventually(degraded, what="DataPlaneFailing")
        assert reported["status"] == "True"
        assert "FileNotFoundError: /models/qwen/config.json" in reported["message"]

        await harness._call(http, "DELETE", f"{pods}/{CRASHING['metadata']['name']}")
        await harness.recovered_then_deleted(kmock, http)
    assert runner.exception is None
