"""The Ready condition: True only while the deployment serves its current spec, rolled
out, with nothing wrong; False carries the reason of the first condition in the way, so
`kubectl wait --for=condition=Ready rd/NAME` is all a pipeline needs."""

from __future__ import annotations

from rimuru.operator.status import Blocker, ChildSpec, Problem
from tests.operator.test_apply_and_status import _obs, _status


def _ready(**kw) -> tuple[str, str]:
    (ready,) = [c for c in _status(_obs(**kw))["conditions"] if c["type"] == "Ready"]
    return ready["status"], ready["reason"]


def test_ready_only_when_available_rolled_out_and_not_degraded():
    assert _ready() == ("True", "Ready")
    assert _ready(ready_replicas=0) == ("False", "NoReplicasReady")
    assert _ready(dataplane_spec=ChildSpec.STALE) == ("False", "RollingOut")
    assert _ready(controlplane_ready=False) == ("False", "ControlPlaneNotReady")
    rejected = Problem(Blocker.CHILD_REJECTED, "the API server rejected Deployment x")
    assert _ready(problem=rejected) == ("False", "ChildRejected")
    assert _ready(desired_replicas=0, current_replicas=0, ready_replicas=0) == (
        "False",
        "ScaledToZero",
    )


def test_ready_is_listed_first_and_fits_the_crd(api, tiny_rd):
    status = _status(_obs())
    assert status["conditions"][0]["type"] == "Ready"
    conditions = api.crd_schema()["properties"]["status"]["properties"]["conditions"]
    assert "Ready" in conditions["items"]["properties"]["type"]["enum"]
