"""The operator end to end: kopf (KopfRunner) against the kmock Kubernetes emulator, a
real control plane (in-process gRPC, port 0) and a real CPU data plane (`rimuru serve`'s
server, configured from the pod spec and ConfigMap the operator wrote) that follows it.

    kubectl apply  -> children with the expected specs and owner references
    kubectl patch spec.policy -> new version on the control plane, applied by the engine,
                                 status PolicySynced, data-plane pod template untouched
    kubectl patch spec.engine -> the pod template rolls (config hash), the policy does not;
                                 Progressing until the Deployment observes the new template
    kubectl patch spec.policy.mode -> rolls too (the engine cannot switch it live); the
                                 running data plane NACKs it: status Degraded
    kubectl delete -> children deleted, finalizer released
    (another test) replicas 0 -> Progressing until the data-plane Deployment observes
                                 it, then phase ScaledToZero

The emulator runs no controllers: the test plays the Deployment controller by writing
the Deployments' status (observedGeneration included), as kubelet and
kube-controller-manager would.
"""

from __future__ import annotations

import asyncio
import base64
import copy

import pytest

from rimuru.operator.builders import Tokens, build_children, with_token_checksums
from rimuru.operator.config import OperatorConfig
from rimuru.operator.spec import parse_spec
from tests.operator.operator_harness import (
    DEPLOYMENTS,
    NS,
    RD,
    RD_PATH,
    TOKEN,
    PodDataPlane,
    _call,
    condition,
    create_token_secret,
    emulate_rollout,
    engine_config_map,
    eventually,
    failed_with,
    get_policy,
    obj,
    operator_calls,
    operator_running,
    recovered_then_deleted,
    rollout_state,
    with_deployment_defaults,
)


@pytest.mark.slow
async def test_apply_tune_roll_and_delete(kmock, env, control_plane, tiny_rd):
    http = env
    rd = copy.deepcopy(tiny_rd)
    rd["spec"]["authSecretRef"] = await create_token_secret(http)
    data_plane = None
    try:
        async with operator_running() as runner:
            await _call(http, "POST", RD_PATH, rd)

            # The data planes' token is always generated, and is not the operator's.
            dp_secret = await eventually(
                lambda: obj(kmock, "v1/secrets", "tiny-dataplane-token"), what="dp token"
            )
            dp_token = base64.b64decode(dp_secret["data"]["token"]).decode()
            assert len(dp_token) >= 32 and dp_token != TOKEN

            # 1. Children, exactly as the builders make them (the pod templates stamped with
            # the checksums of the tokens they read), owned by the RimuruDeployment.
            built = build_children(
                parse_spec(rd["metadata"], rd["spec"]),
                OperatorConfig(dataplane_image="reg/dp:e2e", controlplane_image="reg/cp:e2e"),
            )
            expected = with_token_checksums(built, Tokens(TOKEN, dp_token))
            for child in expected:
                kind, name = child["kind"], child["metadata"]["name"]
                resource = {
                    "Deployment": DEPLOYMENTS,
                    "Service": "v1/services",
                    "ConfigMap": "v1/configmaps",
                }[kind]
                stored = await eventually(lambda r=resource, n=name: obj(kmock, r, n), what=name)
                if kind == "Deployment":  # as stored: with the API server's defaults
                    child = with_deployment_defaults(child)
                for key in ("spec", "data"):
                    assert stored.get(key) == child.get(key), (kind, name, key)
                assert stored["metadata"]["ownerReferences"] == [
                    {
                        "apiVersion": "rimuru.dev/v1alpha1",
                        "kind": "RimuruDeployment",
                        "name": "tiny",
                        "uid": "uid-tiny-1",
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ]
            # referenced, not generated
            assert obj(kmock, "v1/secrets", "tiny-operator-token") is None

            # 2. Pods start from what the operator wrote; the policy reaches the engine.
            pod = obj(kmock, DEPLOYMENTS, "tiny-dataplane")["spec"]["template"]["spec"]
            (container,) = pod["containers"]
            data_plane = PodDataPlane(
                container["args"][1:],
                engine_config_map(kmock)["data"],
                control_plane,
            )
            assert (data_plane.config.model, data_plane.config.memory_budget) == (
                "tiny",
                512 * 2**20,
            )
            await data_plane.start()
            await emulate_rollout(http, "tiny-controlplane", 1)
            await emulate_rollout(http, "tiny-dataplane", 1)

            def synced(version: int):
                rd_now = obj(kmock, RD, "tiny")
                status = rd_now["status"]
                ok = (
                    condition(rd_now, "PolicySynced")["status"] == "True"
                    and status["policy"]["appliedVersion"] == version
                    and status["phase"] == "Available"
                )
                return rd_now if ok else None

            status = (await eventually(lambda: synced(1), what="PolicySynced v1"))["status"]
            assert status["readyReplicas"] == 1
            assert status["selector"] == (
                "app.kubernetes.io/instance=tiny,app.kubernetes.io/component=dataplane"
            )
            assert status["controlPlaneEndpoint"] == "tiny-controlplane.default.svc:50052"
            assert status["endpoints"] == {
                "grpc": "tiny-dataplane.default.svc:50051",
                "http": "http://tiny-dataplane.default.svc:8000",
            }
            assert (await data_plane.tunables()).expert_offload_limit == 2
            template_key = (DEPLOYMENTS, NS, "tiny-dataplane")
            num_versions = len(kmock.objects[template_key].history)
            template = copy.deepcopy(obj(kmock, DEPLOYMENTS, "tiny-dataplane")["spec"])

            # 3. Live tuning: kubectl patch rd tiny --type merge -p '{"spec":{"policy":...}}'
            tuned = {"spec": {"policy": {"expertOffloadLimit": 4, "growThreshold": 12}}}
            await _call(http, "PATCH", f"{RD_PATH}/tiny", tuned, "application/merge-patch+json")
            status = (await eventually(lambda: synced(2), what="PolicySynced v2"))["status"]
            assert status["policy"]["desiredVersion"] == 2
            tunables = await data_plane.tunables()
            assert (tunables.expert_offload_limit, tunables.grow_threshold) == (4, 12)
            policy = await get_policy(control_plane, "tiny")
            assert (policy.version, policy.tunables.expert_offload_limit) == (2, 4)
            # Not a single write to the data-plane Deployment: its pods keep running.
            assert len(kmock.objects[template_key].history) == num_versions
            assert obj(kmock, DEPLOYMENTS, "tiny-dataplane")["spec"] == template

            # 4. An engine change rolls the pods (new config hash) and pushes no policy.
            rolled = {"spec": {"engine": {"maxNumSeqs": 8}}}
            await _call(http, "PATCH", f"{RD_PATH}/tiny", rolled, "application/merge-patch+json")

            def new_template():
                spec = obj(kmock, DEPLOYMENTS, "tiny-dataplane")["spec"]
                return spec if spec["template"] != template["template"] else None

            rolled_spec = await eventually(new_template, what="pod template roll")
            assert rolled_spec["strategy"]["rollingUpdate"]["maxSurge"] == 1  # one replica
            engine_config = engine_config_map(kmock)["data"]
            assert engine_config["RIMURU_MAX_NUM_SEQS"] == "8"
            assert (await get_policy(control_plane, "tiny")).version == 2
            # The Deployment's counts (all updated, all ready) are the old pods' until its
            # controller observes the new template: not a complete rollout until then.
            await eventually(
                lambda: rollout_state(kmock) == ("Progressing", "True", "RollingOut"),
                what="RollingOut on the new template",
            )
            assert condition(obj(kmock, RD, "tiny"), "Progressing")["message"] == (
                "data-plane Deployment: latest spec not observed yet"
            )
            await emulate_rollout(http, "tiny-dataplane", 1)
            await eventually(
                lambda: rollout_state(kmock) == ("Available", "False", "RolloutComplete"),
                what="the new template rolled out",
            )

            # 5. A mode change: the engine cannot switch its memory policy while running,
            # so the template rolls (new pods start in the new mode) and the running
            # data plane NACKs the pushed version, which the status reports as Degraded.
            rolled_template = copy.deepcopy(rolled_spec["template"])
            fixed = {"spec": {"policy": {"mode": "fixed"}}}
            await _call(http, "PATCH", f"{RD_PATH}/tiny", fixed, "application/merge-patch+json")

            def rejected():
                rd_now = obj(kmock, RD, "tiny")
                c = condition(rd_now, "PolicySynced")
                return rd_now if c["reason"] == "Rejected" else None

            status = (await eventually(rejected, what="NACK reported"))["status"]
            assert status["phase"] == "Degraded"
            assert (status["policy"]["desiredVersion"], status["policy"]["appliedVersion"]) == (
                3,
                2,
            )
            degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
            assert (degraded["status"], degraded["reason"]) == ("True", "PolicyRejected")
            assert "restart" in degraded["message"]
            assert (await data_plane.tunables()).mode == "elastic"  # the old policy stays
            new_spec = obj(kmock, DEPLOYMENTS, "tiny-dataplane")["spec"]
            assert new_spec["template"] != rolled_template
            assert engine_config_map(kmock)["data"]["RIMURU_POLICY_MODE"] == "fixed"

            # 6. Delete: the finalizer holds the object until the children are gone.
            await _call(http, "DELETE", f"{RD_PATH}/tiny")
            await eventually(lambda: obj(kmock, RD, "tiny") is None, what="RD deleted")
            for child in expected:
                resource = {"Deployment": DEPLOYMENTS, "Service": "v1/services"}.get(
                    child["kind"], "v1/configmaps"
                )
                assert obj(kmock, resource, child["metadata"]["name"]) is None, child["kind"]
            # The user's Secret is theirs: never deleted.
            assert obj(kmock, "v1/secrets", "tiny-auth") is not None
            assert obj(kmock, "v1/secrets", "tiny-dataplane-token") is None  # ours
        assert runner.exception is None
    finally:
        if data_plane is not None:
            await data_plane.stop()


@pytest.mark.slow
async def test_scale_to_zero_settles_once_the_data_plane_has_scaled(kmock, env, tiny_rd):
    http = env
    rd = copy.deepcopy(tiny_rd)
    rd["spec"]["authSecretRef"] = await create_token_secret(http)
    async with operator_running() as runner:
        await _call(http, "POST", RD_PATH, rd)
        for name in ("tiny-controlplane", "tiny-dataplane"):
            await eventually(lambda n=name: obj(kmock, DEPLOYMENTS, n), what=name)
        await emulate_rollout(http, "tiny-controlplane", 1)
        await emulate_rollout(http, "tiny-dataplane", 1)
        await eventually(
            lambda: rollout_state(kmock) == ("Available", "False", "RolloutComplete"),
            what="Available at one replica",
        )

        # kubectl patch rd tiny --type merge -p '{"spec":{"dataPlane":{"replicas":0}}}'
        scale = {"spec": {"dataPlane": {"replicas": 0}}}
        await _call(http, "PATCH", f"{RD_PATH}/tiny", scale, "application/merge-patch+json")
        await eventually(
            lambda: obj(kmock, DEPLOYMENTS, "tiny-dataplane")["spec"]["replicas"] == 0,
            what="data plane scaled",
        )
        # Its pod still runs: the counts say 1 >= 0, but of the previous generation.
        await eventually(
            lambda: rollout_state(kmock) == ("Progressing", "True", "RollingOut"),
            what="RollingOut to zero",
        )

        await emulate_rollout(http, "tiny-dataplane", 0)
        await eventually(
            lambda: rollout_state(kmock) == ("ScaledToZero", "False", "RolloutComplete"),
            what="phase ScaledToZero",
        )
        rd_now = obj(kmock, RD, "tiny")
        available = condition(rd_now, "Available")
        assert (available["status"], available["reason"]) == ("False", "ScaledToZero")
        assert (rd_now["status"]["replicas"], rd_now["status"]["readyReplicas"]) == (0, 0)

        await _call(http, "DELETE", f"{RD_PATH}/tiny")
        await eventually(lambda: obj(kmock, RD, "tiny") is None, what="RD deleted")
    assert runner.exception is None


@pytest.mark.slow
async def test_generated_token_and_specs_that_cannot_work(kmock, env, tiny_rd):
    http = env
    # No authSecretRef: the operator generates NAME-operator-token and owns it. This control plane
    # was started with another token, so the operator's writes are refused: status says so.
    other = copy.deepcopy(tiny_rd)
    other["metadata"].update(name="other", uid="uid-other-1", resourceVersion="1")
    # Written past the API server's CEL rules (e.g. validation off): can never work.
    broken = copy.deepcopy(tiny_rd)
    broken["metadata"].update(name="broken", uid="uid-broken-1", resourceVersion="1")
    broken["spec"]["engine"] = {
        "gpuMemoryUtilization": 0.9,
        "maxNumSeqs": 16,
        "maxNumBatchedTokens": 8192,
        "blockSize": 16,
    }
    async with operator_running() as runner:
        await _call(http, "POST", RD_PATH, other)
        await _call(http, "POST", RD_PATH, broken)

        secret = await eventually(
            lambda: obj(kmock, "v1/secrets", "other-operator-token"), what="token"
        )
        assert len(base64.b64decode(secret["data"]["token"])) >= 32
        assert secret["metadata"]["ownerReferences"][0]["uid"] == "uid-other-1"

        def waiting():
            c = condition(obj(kmock, RD, "other"), "Progressing")
            return c if c["reason"] == "ControlPlaneUnavailable" else None

        progressing = await eventually(waiting, what="waiting for the control plane")
        assert progressing["message"] == "waiting for Deployment other-controlplane to be ready"
        await emulate_rollout(http, "other-controlplane", 1)

        def refused():
            c = condition(obj(kmock, RD, "other"), "Progressing")
            return c if c["reason"] == "ControlPlaneUnauthenticated" else None

        progressing = await eventually(refused, what="ControlPlaneUnauthenticated")
        assert "other-operator-token" in progressing["message"]
        assert obj(kmock, RD, "other")["status"]["phase"] in ("Pending", "Progressing")

        degraded = await failed_with(kmock, "broken", "InvalidSpec")
        assert "spec.engine.gpuMemoryUtilization" in degraded["message"]
        assert obj(kmock, DEPLOYMENTS, "broken-dataplane") is None  # nothing was created

        await _call(http, "DELETE", f"{RD_PATH}/other")
        await eventually(lambda: obj(kmock, RD, "other") is None, what="other deleted")
        # The generated Secret was the operator's: deleted with the rest.
        assert obj(kmock, "v1/secrets", "other-operator-token") is None
    assert runner.exception is None


async def test_a_deleted_or_hand_edited_child_is_restored(kmock, env, tiny_rd, operator_rbac):
    """Drift: `kubectl edit` of a field the operator owns is undone, and a deleted child
    is created again, within a status interval or two (0.2 s here). Every call the
    operator made on the way is one its RBAC grants."""
    http = env
    rd = copy.deepcopy(tiny_rd)
    rd["spec"]["authSecretRef"] = await create_token_secret(http)
    path = f"/apis/apps/v1/namespaces/{NS}/deployments/tiny-dataplane"

    def image():
        return obj(kmock, DEPLOYMENTS, "tiny-dataplane")["spec"]["template"]["spec"]["containers"][
            0
        ]["image"]

    async with operator_running() as runner:
        await _call(http, "POST", RD_PATH, rd)
        await eventually(lambda: obj(kmock, DEPLOYMENTS, "tiny-dataplane"), what="data plane")
        container = obj(kmock, DEPLOYMENTS, "tiny-dataplane")["spec"]["template"]["spec"][
            "containers"
        ][0]
        edit = {"spec": {"template": {"spec": {"containers": [
            {"name": container["name"], "image": "someone/else:1"}
        ]}}}}  # fmt: skip
        await _call(http, "PATCH", path, edit, "application/merge-patch+json")
        assert image() == "someone/else:1"
        await eventually(lambda: image() == "reg/dp:e2e", timeout=5, what="image restored")
        restored = obj(kmock, DEPLOYMENTS, "tiny-dataplane")["spec"]["template"]["spec"]
        assert restored["containers"][0] == container  # args, env, resources: all back

        await _call(http, "DELETE", path)
        await eventually(
            lambda: obj(kmock, DEPLOYMENTS, "tiny-dataplane") is not None,
            timeout=5,
            what="deleted data plane created again",
        )
        await _call(http, "DELETE", f"{RD_PATH}/tiny")
        await eventually(lambda: obj(kmock, RD, "tiny") is None, what="RD deleted")
    assert runner.exception is None
    calls = operator_calls(kmock)
    assert {"list", "watch", "create", "patch", "delete"} <= calls[("apps", "deployments")]
    for resource, verbs in calls.items():
        assert verbs <= operator_rbac.get(resource, set()), resource


async def test_a_child_the_api_server_rejects_fails_until_the_spec_changes(kmock, env, tiny_rd):
    """A 422 on a child is permanent: status Failed / Degraded with the API server's
    message, steady (no retry each interval), until a spec change tries again."""
    http = env
    rd = copy.deepcopy(tiny_rd)
    rd["spec"]["authSecretRef"] = await create_token_secret(http)
    message = 'Deployment.apps "tiny-dataplane" is invalid: spec.template: denied by policy'
    kmock.invalid["tiny-dataplane"] = message
    async with operator_running() as runner:
        await _call(http, "POST", RD_PATH, rd)
        degraded = await failed_with(kmock, "tiny", "ChildRejected")
        status = obj(kmock, RD, "tiny")["status"]
        assert message in degraded["message"] and "Deployment tiny-dataplane" in degraded["message"]
        progressing = condition(obj(kmock, RD, "tiny"), "Progressing")
        assert (progressing["status"], progressing["reason"]) == ("False", "ChildRejected")

        # Five status intervals later: not one more attempt, the same status.
        num_rejected = kmock.num_rejected
        await asyncio.sleep(1.0)
        assert kmock.num_rejected == num_rejected
        assert obj(kmock, RD, "tiny")["status"] == status

        # The user fixes the cause and changes the spec: the child is created.
        del kmock.invalid["tiny-dataplane"]
        fix = {"spec": {"engine": {"maxNumSeqs": 8}}}
        await _call(http, "PATCH", f"{RD_PATH}/tiny", fix, "application/merge-patch+json")
        await eventually(lambda: obj(kmock, DEPLOYMENTS, "tiny-dataplane"), what="created")
        await recovered_then_deleted(kmock, http)
    assert runner.exception is None


async def test_a_token_secret_that_is_not_text_is_reported_not_raised(kmock, env, tiny_rd):
    """A token Secret whose bytes are not UTF-8: status Degraded / AuthSecretInvalid
    naming the Secret and key, no unhandled UnicodeDecodeError; fixed, it proceeds."""
    http = env
    rd = copy.deepcopy(tiny_rd)
    rd["spec"]["authSecretRef"] = {"name": "tiny-auth", "key": "token"}
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "tiny-auth", "namespace": NS},
        "data": {"token": base64.b64encode(b"\xff\xfe binary \x80").decode()},
    }
    await _call(http, "POST", f"/api/v1/namespaces/{NS}/secrets", secret)
    async with operator_running() as runner:
        await _call(http, "POST", RD_PATH, rd)

        def degraded():
            c = condition(obj(kmock, RD, "tiny"), "Degraded")
            return c if c["reason"] == "AuthSecretInvalid" else None

        reported = await eventually(degraded, what="AuthSecretInvalid")
        assert reported["status"] == "True"
        assert "Secret tiny-auth key 'token' is not a UTF-8 text token" in reported["message"]
        assert obj(kmock, RD, "tiny")["status"]["phase"] == "Degraded"

        fixed = {"data": {"token": base64.b64encode(TOKEN.encode()).decode()}}
        await _call(
            http,
            "PATCH",
            f"/api/v1/namespaces/{NS}/secrets/tiny-auth",
            fixed,
            "application/merge-patch+json",
        )
        await recovered_then_deleted(kmock, http)
    assert runner.exception is None
