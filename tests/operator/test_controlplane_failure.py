"""A control-plane pod that cannot run degrades the RimuruDeployment as a failing data plane
does: Degraded, reason ControlPlaneFailing, with the kubelet's story of the pod (it read
Progressing with Degraded False). The kubelet's report is written by the test."""

from __future__ import annotations

from tests.operator import operator_harness as harness
from tests.operator.test_apply_and_status import _obs, _status

CRASHING_CONTROL_PLANE = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "name": "tiny-controlplane-7f9-x",
        "namespace": harness.NS,
        "labels": {
            "app.kubernetes.io/name": "rimuru",
            "app.kubernetes.io/instance": "tiny",
            "app.kubernetes.io/component": "controlplane",
            "app.kubernetes.io/part-of": "rimuru",
            "app.kubernetes.io/managed-by": "rimuru-operator",
        },
    },
    "spec": {"containers": [{"name": "controlplane", "image": "reg/cp:e2e"}]},
    "status": {
        "phase": "Running",
        "containerStatuses": [
            {
                "name": "controlplane",
                "ready": False,
                "restartCount": 5,
                "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 2m"}},
                "lastState": {
                    "terminated": {
                        "exitCode": 2,
                        "reason": "Error",
                        "message": "rimuru controlplane: --token-file: no such file",
                    }
                },
            }
        ],
    },
}


def test_a_failing_control_plane_degrades_the_status_first():
    status = _status(
        _obs(controlplane_ready=False, controlplane_failure="pod cp: CrashLoopBackOff",
             dataplane_failure="pod dp: CrashLoopBackOff")
    )  # fmt: skip
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded == {**degraded, "status": "True", "reason": "ControlPlaneFailing",
                        "message": "pod cp: CrashLoopBackOff"}  # fmt: skip
    assert status["phase"] == "Degraded"


async def test_the_operator_reports_a_crash_looping_control_plane(kmock, env, tiny_rd):
    http = env
    pods = f"/api/v1/namespaces/{harness.NS}/pods"
    async with harness.operator_running() as runner:
        await harness.create_tiny(http, tiny_rd)
        await harness.eventually(
            lambda: harness.obj(kmock, harness.DEPLOYMENTS, "tiny-controlplane"), what="cp"
        )
        await harness._call(http, "POST", pods, CRASHING_CONTROL_PLANE)

        def degraded():
            c = harness.condition(harness.obj(kmock, harness.RD, "tiny"), "Degraded")
            return c if c["reason"] == "ControlPlaneFailing" else None

        reported = await harness.eventually(degraded, what="ControlPlaneFailing")
        assert reported["status"] == "True"
        assert reported["message"] == (
            "pod tiny-controlplane-7f9-x: CrashLoopBackOff; last exit code 2 (Error): "
            "rimuru controlplane: --token-file: no such file"
        )
        assert harness.obj(kmock, harness.RD, "tiny")["status"]["phase"] == "Degraded"

        await harness._call(http, "DELETE", f"{pods}/tiny-controlplane-7f9-x")
        await harness.recovered_then_deleted(kmock, http)
    assert runner.exception is None
