"""An image model volume on a cluster too old for image volumes: refused up front with
a status that says why, instead of a data-plane Deployment the API server would reject.
Against the emulated API server, whose /version the test sets."""

from __future__ import annotations

import copy

import kubernetes_validate
import pytest

from rimuru.operator.builders import build_dataplane_deployment
from rimuru.operator.cluster import parse_server_version, unsupported_feature
from rimuru.operator.config import OperatorConfig
from rimuru.operator.spec import parse_spec
from tests.operator.operator_harness import (
    DEPLOYMENTS,
    RD,
    RD_PATH,
    _call,
    create_token_secret,
    eventually,
    failed_with,
    obj,
    operator_running,
)

IMAGE = {"reference": "registry.example/models/tiny-moe:1", "pullPolicy": "IfNotPresent"}


def _image_model(rd):
    rd = copy.deepcopy(rd)
    rd["spec"]["model"] = {"path": "tiny-moe", "volume": {"image": IMAGE}, "dtype": "float32"}
    return rd


def _version(minor: str) -> dict[str, str]:
    return {"major": "1", "minor": minor, "gitVersion": f"v1.{minor.rstrip('+')}.0"}


@pytest.mark.parametrize(
    "info,refused",
    [
        (_version("30"), True),
        (_version("28+"), True),  # how some providers write it
        (_version("31"), False),
        (_version("35"), False),
        ({"major": "", "minor": ""}, False),  # unknown: the API server has the last word
    ],
)
def test_image_volumes_need_kubernetes_1_31(tiny_rd, info, refused):
    spec = parse_spec(tiny_rd["metadata"], _image_model(tiny_rd)["spec"])
    message = unsupported_feature(spec, parse_server_version(info))
    assert (message is not None) == refused
    if refused:
        assert message.startswith("spec.model.volume.image needs Kubernetes 1.31 or later")
        assert "persistentVolumeClaim" in message
    preset = parse_spec(tiny_rd["metadata"], tiny_rd["spec"])
    assert unsupported_feature(preset, parse_server_version(_version("30"))) is None


def test_the_image_volume_is_valid_where_it_exists(tiny_rd, api):
    spec = parse_spec(tiny_rd["metadata"], _image_model(tiny_rd)["spec"])
    deployment = build_dataplane_deployment(spec, OperatorConfig())
    assert {"name": "model", "image": IMAGE} in deployment["spec"]["template"]["spec"]["volumes"]
    kubernetes_validate.validate(deployment, "1.33", strict=True)


async def test_an_old_cluster_refuses_an_image_volume_in_status(kmock, env, tiny_rd):
    kmock["get /version"] << _version("30")
    http = env
    rd = _image_model(tiny_rd)
    rd["spec"]["authSecretRef"] = await create_token_secret(http)
    async with operator_running() as runner:
        await _call(http, "POST", RD_PATH, rd)
        degraded = await failed_with(kmock, "tiny", "UnsupportedByCluster")
        assert "this cluster is 1.30" in degraded["message"]
        assert obj(kmock, DEPLOYMENTS, "tiny-dataplane") is None  # nothing was written
        await _call(http, "DELETE", f"{RD_PATH}/tiny")
        await eventually(lambda: obj(kmock, RD, "tiny") is None, what="RD deleted")
    assert runner.exception is None
