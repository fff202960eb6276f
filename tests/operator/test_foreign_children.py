"""An object that holds a child's name but is not this RimuruDeployment's is never adopted:
no owner reference, label or data of it is written, it is not deleted with the
RimuruDeployment, and the status says whose it is (Degraded, ChildOwnedElsewhere)."""

from __future__ import annotations

import base64
import copy

from rimuru.operator.builders import build_engine_config_map
from rimuru.operator.spec import parse_spec
from tests.operator import operator_harness as harness

FOREIGN_OWNER = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "name": "someone-else",
    "uid": "uid-someone-else",
    "controller": True,
}


async def _create(http, resource: str, body: dict) -> dict:
    return await harness._call(http, "POST", f"/api/v1/namespaces/{harness.NS}/{resource}", body)


def _degraded(kmock) -> dict:
    return harness.condition(harness.obj(kmock, harness.RD, "tiny"), "Degraded")


async def test_a_foreign_config_map_is_left_untouched(kmock, env, tiny_rd):
    http = env
    name = build_engine_config_map(parse_spec(tiny_rd["metadata"], tiny_rd["spec"]))["metadata"][
        "name"
    ]
    foreign = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": harness.NS, "ownerReferences": [FOREIGN_OWNER]},
        "data": {"theirs": "yes"},
    }
    await _create(http, "configmaps", foreign)
    before = copy.deepcopy(harness.obj(kmock, "v1/configmaps", name))
    async with harness.operator_running() as runner:
        await harness.create_tiny(http, tiny_rd)
        await harness.eventually(
            lambda: _degraded(kmock)["reason"] == "ChildOwnedElsewhere", what="refused"
        )
        degraded = _degraded(kmock)
        assert degraded["status"] == "True"
        assert f"ConfigMap {name} exists" in degraded["message"]
        assert "owned by Deployment someone-else" in degraded["message"]
        assert harness.obj(kmock, harness.RD, "tiny")["status"]["phase"] == "Degraded"
        assert harness.obj(kmock, "v1/configmaps", name) == before
        await harness.deleted(kmock, http)
        assert harness.obj(kmock, "v1/configmaps", name) == before  # not deleted with it
    assert runner.exception is None


async def test_a_foreign_secret_under_the_generated_token_name_is_not_used(kmock, env, tiny_rd):
    """Without authSecretRef the operator generates NAME-operator-token; one that exists
    and is another's holds a token its owner knows: neither used nor deleted."""
    http = env
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "tiny-operator-token", "namespace": harness.NS},
        "data": {"token": base64.b64encode(b"known-to-them").decode()},
    }
    await _create(http, "secrets", secret)
    before = copy.deepcopy(harness.obj(kmock, "v1/secrets", "tiny-operator-token"))
    async with harness.operator_running() as runner:
        await harness._call(http, "POST", harness.RD_PATH, copy.deepcopy(tiny_rd))
        await harness.eventually(
            lambda: _degraded(kmock)["reason"] == "ChildOwnedElsewhere", what="refused"
        )
        assert "Secret tiny-operator-token exists" in _degraded(kmock)["message"]
        assert "it has no owner" in _degraded(kmock)["message"]
        # Nothing that would mount it was written.
        assert harness.obj(kmock, harness.DEPLOYMENTS, "tiny-controlplane") is None
        await harness.deleted(kmock, http)
        assert harness.obj(kmock, "v1/secrets", "tiny-operator-token") == before
    assert runner.exception is None
