"""Specs that would deploy something that cannot work are refused: by the API server (the
CRD's CEL rules, here through the emulated admission) and, for a CRD without those rules
or an object written past them, by the operator before it writes anything (phase Failed,
Degraded InvalidSpec). Refused: replicas 0 with autoscaling (the HPA does not scale up
from 0), more GPUs than tensor-parallel ranks (the rest sit idle), and GPUs of two kinds."""

from __future__ import annotations

import copy

import pytest

from rimuru.operator.spec import SpecError, parse_spec
from tests.operator import operator_harness as harness

AUTOSCALING = {"minReplicas": 1, "maxReplicas": 4}
REFUSED = {
    "replicas 0 with autoscaling": (
        {"dataPlane": {"replicas": 0}, "autoscaling": AUTOSCALING},
        "spec.dataPlane.replicas must be at least 1 with spec.autoscaling",
        ("spec.dataPlane.replicas", "must be at least 1 with spec.autoscaling"),
    ),
    "four GPUs, one rank": (
        {"dataPlane": {"resources": {"limits": {"nvidia.com/gpu": 4}}}},
        "more than one GPU with spec.engine.tensorParallelSize 1",
        ("spec.engine.tensorParallelSize", "ask for 4 GPUs: 3 would sit idle"),
    ),
    "two GPU vendors": (
        {"dataPlane": {"resources": {"limits": {"nvidia.com/gpu": 1, "amd.com/gpu": "1"}}}},
        "mix GPU resources",
        ("spec.dataPlane.resources.limits", "mix GPU resources (amd.com/gpu, nvidia.com/gpu)"),
    ),
}
ACCEPTED = {
    "replicas 0 without autoscaling": {"dataPlane": {"replicas": 0}},
    "replicas 1 with autoscaling": {"dataPlane": {"replicas": 1}, "autoscaling": AUTOSCALING},
    "four GPUs, four ranks": {
        "dataPlane": {"resources": {"limits": {"nvidia.com/gpu": 4}}},
        "engine": {"tensorParallelSize": 4},
    },
    "one GPU, one zero of another kind": {
        "dataPlane": {"resources": {"limits": {"nvidia.com/gpu": 1, "amd.com/gpu": 0}}}
    },
}


def _merged(base: dict, change: dict) -> dict:
    merged = copy.deepcopy(base)
    for key, value in change.items():
        if isinstance(value, dict):
            merged[key] = _merged(merged.get(key) or {}, value)
        else:
            merged[key] = value
    return merged


def _stored(tiny_rd: dict, change: dict) -> dict:
    return {**tiny_rd, "spec": _merged(tiny_rd["spec"], change)}


@pytest.mark.parametrize("change,admission,_", REFUSED.values(), ids=REFUSED.keys())
def test_the_api_server_refuses(api, tiny_rd, change, admission, _):
    _, errors = api.admit(_stored(tiny_rd, change))
    assert len(errors) == 1 and admission in errors[0], errors


@pytest.mark.parametrize("change,_,refusal", REFUSED.values(), ids=REFUSED.keys())
def test_the_operator_refuses_what_got_past_admission(tiny_rd, change, _, refusal):
    rd = _stored(tiny_rd, change)
    with pytest.raises(SpecError) as info:
        parse_spec(rd["metadata"], rd["spec"])
    field, message = refusal
    assert info.value.field == field
    assert message in str(info.value)


@pytest.mark.parametrize("change", ACCEPTED.values(), ids=ACCEPTED.keys())
def test_what_can_work_is_accepted(api, tiny_rd, change):
    rd, errors = api.admit(_stored(tiny_rd, change))
    assert errors == []
    parse_spec(tiny_rd["metadata"], rd["spec"])


async def test_a_refused_spec_writes_nothing(kmock, env, tiny_rd):
    http = env
    change, _, (field, message) = REFUSED["replicas 0 with autoscaling"]
    async with harness.operator_running() as runner:
        await harness.create_tiny(http, _stored(tiny_rd, change))
        degraded = await harness.failed_with(kmock, "tiny", "InvalidSpec")
        assert f"{field}: {message}" in degraded["message"]
        assert harness.obj(kmock, harness.DEPLOYMENTS, "tiny-dataplane") is None
        assert harness.obj(kmock, harness.DEPLOYMENTS, "tiny-controlplane") is None
        await harness.deleted(kmock, http)
    assert runner.exception is None
