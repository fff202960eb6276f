"""The escape hatch: spec.dataPlane.extraArgs and extraEnv reach the data-plane container
as written (flags after the operator's, so the spec's win, and are what `rimuru serve`
parses); the variables the operator sets itself cannot be replaced."""

from __future__ import annotations

import argparse
import copy

import kubernetes_validate
import pytest

from rimuru.dataplane.serve import cli as serve_cli
from rimuru.operator.builders import build_dataplane_deployment
from rimuru.operator.config import OperatorConfig
from rimuru.operator.extras import OPERATOR_ENV
from rimuru.operator.spec import SpecError, parse_spec

CONFIG = OperatorConfig(dataplane_image="reg/dp:1", controlplane_image="reg/cp:1")
SECRET_ENV = {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}


def _with(rd, api, **data_plane):
    rd = copy.deepcopy(rd)
    rd["spec"]["dataPlane"].update(data_plane)
    return api.admit(rd)


def _container(rd):
    deployment = build_dataplane_deployment(parse_spec(rd["metadata"], rd["spec"]), CONFIG)
    return deployment, deployment["spec"]["template"]["spec"]["containers"][0]


def test_extra_args_and_env_reach_the_container(tiny_rd, api):
    extra_args = ["--drain-grace-seconds", "5", "--report-interval", "30"]
    extra_env = [{"name": "RIMURU_MAX_NUM_SEQS", "value": "4"}, SECRET_ENV]
    rd, errors = _with(tiny_rd, api, extraArgs=extra_args, extraEnv=extra_env)
    assert errors == []
    deployment, container = _container(rd)
    assert container["args"][-4:] == extra_args
    assert container["env"][-2:] == extra_env
    assert [v["name"] for v in container["env"][:-2]] == list(OPERATOR_ENV)
    kubernetes_validate.validate(deployment, api.kube_version, strict=True)
    # What `rimuru serve` makes of the args: the spec's flag wins over the operator's.
    parser = argparse.ArgumentParser()
    serve_cli.add_arguments(parser)
    assert parser.parse_args(container["args"][1:]).drain_grace_seconds == 5


@pytest.mark.parametrize("name", OPERATOR_ENV)
def test_the_operators_env_cannot_be_replaced(tiny_rd, api, name):
    rd, errors = _with(tiny_rd, api, extraEnv=[{"name": name, "value": "x"}])
    assert errors == [
        "spec.dataPlane.extraEnv: RIMURU_NODE_ID, HOME and TRITON_CACHE_DIR are set by the operator"
    ]
    with pytest.raises(SpecError) as info:
        parse_spec(rd["metadata"], rd["spec"])
    assert info.value.field == "spec.dataPlane.extraEnv"
