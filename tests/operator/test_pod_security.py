"""A hostPath model volume breaks the restricted Pod Security profile: the status says so
(RestrictedPodSecurity False, reason HostPathVolume) and so does a Warning event, while
every other spec's pods meet the profile (condition True)."""

from __future__ import annotations

import copy

from rimuru.operator.pod_security import restricted_profile_findings
from rimuru.operator.spec import parse_spec
from tests.operator.operator_harness import (
    RD,
    RD_PATH,
    _call,
    condition,
    create_token_secret,
    eventually,
    obj,
    operator_running,
)
from tests.operator.test_apply_and_status import _obs, _status

HOST_PATH = {"hostPath": {"path": "/mnt/models"}}


def _host_path_model(rd):
    rd = copy.deepcopy(rd)
    rd["spec"]["model"] = {"path": "tiny-moe", "volume": HOST_PATH, "dtype": "float32"}
    return rd


def _restricted(spec) -> dict:
    status = _status(_obs(pod_security=restricted_profile_findings(spec)))
    return condition({"status": status}, "RestrictedPodSecurity")


def test_only_a_host_path_volume_breaks_the_restricted_profile(tiny_rd, gpu_rd):
    for rd in (tiny_rd, gpu_rd):  # a preset, a PVC
        met = _restricted(parse_spec(rd["metadata"], rd["spec"]))
        assert (met["status"], met["reason"]) == ("True", "MeetsRestricted")
    rd = _host_path_model(tiny_rd)
    broken = _restricted(parse_spec(rd["metadata"], rd["spec"]))
    assert (broken["status"], broken["reason"]) == ("False", "HostPathVolume")
    assert "spec.model.volume.hostPath (/mnt/models)" in broken["message"]
    assert "pod-security.kubernetes.io/enforce: restricted" in broken["message"]


def _warnings(kmock) -> list[dict]:
    return [
        request.data
        for request in kmock
        if request.resource is not None
        and request.resource.plural == "events"
        and isinstance(request.data, dict)
        and request.data.get("type") == "Warning"
    ]


async def test_the_operator_reports_a_host_path_volume(kmock, env, tiny_rd):
    http = env
    rd = _host_path_model(tiny_rd)
    rd["spec"]["authSecretRef"] = await create_token_secret(http)
    async with operator_running() as runner:
        await _call(http, "POST", RD_PATH, rd)

        def reported():
            c = condition(obj(kmock, RD, "tiny"), "RestrictedPodSecurity")
            return c if c["reason"] == "HostPathVolume" else None

        assert (await eventually(reported, what="condition"))["status"] == "False"
        (event, *_) = await eventually(lambda: _warnings(kmock), what="Warning event")
        assert event["reason"] == "HostPathVolume"
        assert event["involvedObject"]["name"] == "tiny"
        assert "breaks the restricted Pod Security profile" in event["message"]
        await _call(http, "DELETE", f"{RD_PATH}/tiny")
        await eventually(lambda: obj(kmock, RD, "tiny") is None, what="RD deleted")
    assert runner.exception is None
