"""The pure builders: exact fields of every child, and what a spec change may touch."""

from __future__ import annotations

import copy

import kubernetes_validate
import pytest

from rimuru.operator.builders import (
    build_children,
    build_controlplane_deployment,
    build_dataplane_deployment,
    build_dataplane_service,
    build_dataplane_token_secret,
    build_engine_config_map,
    build_policy_pvc,
    build_token_secret,
)
from rimuru.operator.config import OperatorConfig
from rimuru.operator.engine_config import LIVE_KEYS
from rimuru.operator.spec import SpecError, parse_spec
from rimuru.policy import Tunables

CONFIG = OperatorConfig(dataplane_image="reg/dp:1", controlplane_image="reg/cp:1")


def _parse(rd):
    return parse_spec(rd["metadata"], rd["spec"])


def test_every_child_is_owned_labelled_and_valid(tiny_rd, api):
    spec = _parse(tiny_rd)
    children = [
        *build_children(spec, CONFIG),
        build_token_secret(spec, "t0k3n"),
        build_dataplane_token_secret(spec, "dp-t0k3n"),
    ]
    kinds = [(c["kind"], c["metadata"]["name"]) for c in children]
    assert kinds == [
        ("ConfigMap", build_engine_config_map(spec)["metadata"]["name"]),  # no PVC here
        ("Deployment", "tiny-controlplane"),
        ("Service", "tiny-controlplane"),
        ("Deployment", "tiny-dataplane"),
        ("Service", "tiny-dataplane"),
        ("Secret", "tiny-operator-token"),
        ("Secret", "tiny-dataplane-token"),
    ]
    for child in children:
        meta = child["metadata"]
        assert meta["namespace"] == "default"
        assert meta["ownerReferences"] == [
            {
                "apiVersion": "rimuru.dev/v1alpha1",
                "kind": "RimuruDeployment",
                "name": "tiny",
                "uid": "uid-tiny-1",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        assert meta["labels"]["app.kubernetes.io/instance"] == "tiny"
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "rimuru-operator"
        kubernetes_validate.validate(child, api.kube_version, strict=True)


@pytest.mark.parametrize("rd_name", ["tiny_rd", "gpu_rd"])
def test_every_example_pod_requests_what_it_needs(rd_name, request):
    # Without requests a pod is BestEffort: scheduled anywhere, evicted first under pressure.
    children = build_children(_parse(request.getfixturevalue(rd_name)), CONFIG)
    deployments = [c for c in children if c["kind"] == "Deployment"]
    assert len(deployments) == 2
    for deployment in deployments:
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        resources = container["resources"]
        assert {"cpu", "memory"} <= resources["requests"].keys(), container["name"]
        assert "memory" in resources["limits"], container["name"]


def test_dataplane_deployment_fields(tiny_rd):
    deployment = build_dataplane_deployment(_parse(tiny_rd), CONFIG)
    spec = deployment["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {  # one replica: surge, so it keeps serving
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    selector = {"app.kubernetes.io/instance": "tiny", "app.kubernetes.io/component": "dataplane"}
    assert spec["selector"] == {"matchLabels": selector}
    template = spec["template"]
    assert selector.items() <= template["metadata"]["labels"].items()
    annotations = template["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "9464"
    assert annotations["prometheus.io/path"] == "/metrics"
    assert len(annotations["rimuru.dev/engine-config-hash"]) == 16
    (container,) = template["spec"]["containers"]
    assert container["image"] == "reg/dp:1"  # the operator's default: the example names none
    assert container["args"] == [
        "serve",
        "--port",
        "50051",
        "--metrics-port",
        "9464",
        "--control-plane",
        "tiny-controlplane:50052",
        "--deployment",
        "tiny",
        "--token-file",
        "/var/run/secrets/rimuru/token",
        "--drain-grace-seconds",
        "50",  # terminationGracePeriodSeconds 60, less the exit margin
        "--http-port",
        "8000",
    ]
    # the ConfigMap named by the hash of the config it holds
    config_hash = annotations["rimuru.dev/engine-config-hash"]
    assert container["envFrom"] == [{"configMapRef": {"name": f"tiny-engine-{config_hash[:10]}"}}]
    assert container["ports"] == [
        {"name": "grpc", "containerPort": 50051, "protocol": "TCP"},
        {"name": "metrics", "containerPort": 9464, "protocol": "TCP"},
        {"name": "http", "containerPort": 8000, "protocol": "TCP"},
    ]
    # startupTimeoutSeconds 300 / probePeriodSeconds 10 -> 30 failures before a restart.
    assert container["startupProbe"] == {
        "grpc": {"port": 50051},
        "periodSeconds": 10,
        "timeoutSeconds": 5,
        "failureThreshold": 30,
    }
    # The HTTP API is on by default: ready is what its /health says (503 loading, draining).
    assert container["readinessProbe"] == {
        "httpGet": {"path": "/health", "port": "http"},
        "periodSeconds": 10,
        "timeoutSeconds": 5,
        "failureThreshold": 3,
    }
    assert container["livenessProbe"]["grpc"] == {"port": 50051}
    assert container["livenessProbe"]["failureThreshold"] == 6
    assert container["resources"] == {
        "requests": {"cpu": "1", "memory": "2Gi"},
        "limits": {"memory": "2Gi"},
    }
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    pod = template["spec"]
    assert pod["terminationGracePeriodSeconds"] == 60
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["automountServiceAccountToken"] is False
    assert {v["name"] for v in pod["volumes"]} == {"token", "tmp"}  # preset: no model volume
    assert "nodeSelector" not in pod and "tolerations" not in pod


def test_gpu_dataplane_places_and_mounts(gpu_rd):
    spec = _parse(gpu_rd)
    pod = build_dataplane_deployment(spec, CONFIG)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": 1, "memory": "96Gi"}
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200"}
    assert pod["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert {
        "name": "model",
        "persistentVolumeClaim": {"claimName": "model-weights", "readOnly": True},
    } in pod["volumes"]
    assert {"name": "model", "mountPath": "/models", "readOnly": True} in container["volumeMounts"]
    assert container["startupProbe"]["failureThreshold"] == 360  # 3600 s / 10 s
    assert pod["terminationGracePeriodSeconds"] == 120
    secret_volume = next(v for v in pod["volumes"] if v["name"] == "token")
    # The data planes' own token, never the operator's (authSecretRef: qwen-moe-token).
    assert secret_volume["secret"]["secretName"] == "qwen-moe-dataplane-token"


@pytest.mark.parametrize(
    "limits,device",
    [
        ({"nvidia.com/gpu": 1}, "cuda"),
        ({"amd.com/gpu": "1"}, "cuda"),  # ROCm torch calls it "cuda" too
        ({"nvidia.com/mig-1g.10gb": 1}, "cuda"),
        ({"nvidia.com/gpu": 0}, "cpu"),  # asks for no GPU
        ({"memory": "2Gi"}, "cpu"),
    ],
)
def test_the_engine_runs_on_whatever_gpu_the_pod_gets(tiny_rd, limits, device):
    rd = _changed(tiny_rd, "dataPlane.resources", {"limits": limits})
    assert build_engine_config_map(_parse(rd))["data"]["RIMURU_DEVICE"] == device


def test_gpu_memory_utilization_needs_a_gpu_above_zero(tiny_rd):
    rd = _changed(tiny_rd, "dataPlane.resources", {"limits": {"nvidia.com/gpu": 0}})
    rd["spec"]["engine"] = {**rd["spec"]["engine"], "gpuMemoryUtilization": 0.5}
    del rd["spec"]["engine"]["memoryBudget"]
    with pytest.raises(SpecError) as info:
        _parse(rd)
    assert info.value.field == "spec.engine.gpuMemoryUtilization"
    rd["spec"]["dataPlane"]["resources"]["limits"] = {"nvidia.com/mig-2g.20gb": 1}
    assert _parse(rd).data_plane.num_gpus == 1


def test_engine_config_map(gpu_rd, tiny_rd):
    assert build_engine_config_map(_parse(gpu_rd))["data"] == {
        "RIMURU_DTYPE": "bfloat16",
        "RIMURU_MODEL_PATH": "/models/Qwen1.5-MoE-A2.7B",
        "RIMURU_DEVICE": "cuda",
        "RIMURU_GPU_MEMORY_UTILIZATION": "0.9",
        "RIMURU_MAX_NUM_SEQS": "256",
        "RIMURU_MAX_NUM_BATCHED_TOKENS": "8192",
        "RIMURU_LOADING_BUFFER_SLOTS": "16",
        "RIMURU_POLICY_MODE": "elastic",
        # the live fields' start-up values (out of the hash: engine_config.LIVE_KEYS)
        "RIMURU_EXPERT_OFFLOAD_LIMIT": "16",
        "RIMURU_SHRINK_THRESHOLD": "2",
        "RIMURU_GROW_THRESHOLD": "9",
        "RIMURU_MAX_GROW_PER_ROUND": "5",
        "RIMURU_COPY_BUDGET": "0.0",
        "RIMURU_ELASTIC_RULE": "cost",
        "RIMURU_TPOT_SLO_MS": "0.0",
    }
    assert build_engine_config_map(_parse(tiny_rd))["data"] == {
        "RIMURU_DTYPE": "float32",
        "RIMURU_PRESET": "tiny",
        "RIMURU_DEVICE": "cpu",
        "RIMURU_MEMORY_BUDGET_BYTES": str(512 * 2**20),
        "RIMURU_MAX_NUM_SEQS": "16",
        "RIMURU_MAX_NUM_BATCHED_TOKENS": "8192",
        "RIMURU_LOADING_BUFFER_SLOTS": "16",
        "RIMURU_POLICY_MODE": "elastic",
        "RIMURU_EXPERT_OFFLOAD_LIMIT": "2",
        "RIMURU_SHRINK_THRESHOLD": "2",
        "RIMURU_GROW_THRESHOLD": "9",
        "RIMURU_MAX_GROW_PER_ROUND": "5",
        "RIMURU_COPY_BUDGET": "0.0",
        "RIMURU_ELASTIC_RULE": "cost",
        "RIMURU_TPOT_SLO_MS": "0.0",
    }


def test_dataplane_service_ports_and_scrape_annotations(tiny_rd):
    service = build_dataplane_service(_parse(tiny_rd))
    assert service["metadata"]["annotations"]["prometheus.io/port"] == "9464"
    assert service["spec"]["selector"] == {
        "app.kubernetes.io/instance": "tiny",
        "app.kubernetes.io/component": "dataplane",
    }
    assert service["spec"]["ports"] == [
        {
            "name": "grpc",
            "port": 50051,
            "targetPort": "grpc",
            "protocol": "TCP",
            "appProtocol": "grpc",
        },
        {
            "name": "metrics",
            "port": 9464,
            "targetPort": "metrics",
            "protocol": "TCP",
            "appProtocol": "http",
        },
        {
            "name": "http",
            "port": 8000,
            "targetPort": "http",
            "protocol": "TCP",
            "appProtocol": "http",
        },
    ]


@pytest.mark.parametrize("port", [0, None])  # 0 turns it off; None = a CRD without the field
def test_http_api_off_keeps_grpc_readiness_and_no_http_port(tiny_rd, port):
    rd = copy.deepcopy(tiny_rd)
    if port is None:
        del rd["spec"]["dataPlane"]["httpPort"]
    else:
        rd["spec"]["dataPlane"]["httpPort"] = port
    spec = _parse(rd)
    assert spec.data_plane.http_port is None
    (container,) = build_dataplane_deployment(spec, CONFIG)["spec"]["template"]["spec"][
        "containers"
    ]
    assert "--http-port" not in container["args"]
    assert [p["name"] for p in container["ports"]] == ["grpc", "metrics"]
    assert container["readinessProbe"]["grpc"] == {"port": 50051}
    assert "httpGet" not in container["readinessProbe"]
    service_ports = build_dataplane_service(spec)["spec"]["ports"]
    assert [p["name"] for p in service_ports] == ["grpc", "metrics"]


def test_http_port_reaches_args_container_and_service(tiny_rd):
    spec = _parse(_changed(tiny_rd, "dataPlane.httpPort", 8080))
    (container,) = build_dataplane_deployment(spec, CONFIG)["spec"]["template"]["spec"][
        "containers"
    ]
    assert container["args"][-2:] == ["--http-port", "8080"]
    assert {"name": "http", "containerPort": 8080, "protocol": "TCP"} in container["ports"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    (service_port,) = [
        p for p in build_dataplane_service(spec)["spec"]["ports"] if p["name"] == "http"
    ]
    assert (service_port["port"], service_port["targetPort"]) == (8080, "http")


@pytest.mark.parametrize("port", [80, 50051, 9464, 65536, -1, True, "8000"])
def test_unusable_http_port_is_refused_with_what_to_set(tiny_rd, port):
    with pytest.raises(SpecError) as info:
        _parse(_changed(tiny_rd, "dataPlane.httpPort", port))
    assert info.value.field == "spec.dataPlane.httpPort"
    assert "must be 0 (off) or a port from 1024 to 65535 other than 50051 (gRPC)" in str(info.value)


def test_controlplane_persists_to_its_volume(gpu_rd, tiny_rd):
    spec = _parse(gpu_rd)
    deployment = build_controlplane_deployment(spec, CONFIG)
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "reg/cp:1"
    assert container["args"] == [
        "controlplane",
        "--port",
        "50052",
        "--data-dir",
        "/var/lib/rimuru",
        "--token-file",
        "/var/run/secrets/rimuru/token",
        "--dataplane-token-file",
        "/var/run/secrets/rimuru/dataplane-token",
    ]
    assert container["readinessProbe"]["grpc"] == {"port": 50052}
    assert {"name": "policy", "persistentVolumeClaim": {"claimName": "qwen-moe-policy"}} in pod[
        "volumes"
    ]
    assert build_policy_pvc(spec)["spec"] == {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "1Gi"}},
    }
    tiny_pod = build_controlplane_deployment(_parse(tiny_rd), CONFIG)["spec"]["template"]["spec"]
    assert {"name": "policy", "emptyDir": {}} in tiny_pod["volumes"]


def _changed(rd, path, value):
    rd = copy.deepcopy(rd)
    node = rd["spec"]
    *parents, leaf = path.split(".")
    for key in parents:
        node = node[key]
    node[leaf] = value
    return rd


@pytest.mark.parametrize(
    "path,value",
    [
        ("policy.expertOffloadLimit", 20),
        ("policy.shrinkThreshold", 1),
        ("policy.maxGrowPerRound", 2),
        ("policy.growThreshold", 12),
        ("policy.onlineHotness", False),
        ("policy.copyBudget", 1.5),
        ("policy.elasticRule", "paper"),
        ("policy.tpotSloMs", 80.0),
        ("policy.ranking", {"configMapName": "other", "key": "r.json"}),
    ],
)
def test_policy_change_leaves_every_child_unchanged(gpu_rd, path, value):
    """Tuning never rolls the pods. Only the engine ConfigMap's start-up values of the live
    fields follow the spec (so a new pod starts with them), outside the pods' hash."""

    def without_live_keys(children):
        return [
            {**c, "data": {k: v for k, v in c["data"].items() if k not in LIVE_KEYS}}
            if c["kind"] == "ConfigMap" and "data" in c
            else c
            for c in children
        ]

    before = build_children(_parse(gpu_rd), CONFIG)
    after_rd = _changed(gpu_rd, path, value)
    after = build_children(_parse(after_rd), CONFIG)
    assert without_live_keys(after) == without_live_keys(before)
    assert _parse(after_rd).policy != _parse(gpu_rd).policy


@pytest.mark.parametrize(
    "path,value",
    [
        ("engine.maxNumSeqs", 128),
        ("model.dtype", "float16"),
        ("dataPlane.image", "reg/dp:2"),
        ("dataPlane.startupTimeoutSeconds", 600),
        # The engine cannot switch these while running (it NACKs them): new pods must.
        ("policy.mode", "fixed"),
    ],
)
def test_engine_change_rolls_the_pods(gpu_rd, path, value):
    before = build_dataplane_deployment(_parse(gpu_rd), CONFIG)["spec"]["template"]
    after = build_dataplane_deployment(_parse(_changed(gpu_rd, path, value)), CONFIG)
    assert after["spec"]["template"] != before


def test_scaling_changes_replicas_not_the_template(gpu_rd):
    before = build_dataplane_deployment(_parse(gpu_rd), CONFIG)["spec"]
    after = build_dataplane_deployment(_parse(_changed(gpu_rd, "dataPlane.replicas", 5)), CONFIG)
    assert after["spec"]["replicas"] == 5
    assert after["spec"]["template"] == before["template"]


def test_policy_becomes_control_plane_tunables(gpu_rd):
    assert _parse(gpu_rd).policy.tunables == Tunables(
        mode="elastic",
        expert_offload_limit=16,
        shrink_threshold=2,
        grow_threshold=9,
        max_grow_per_round=5,
        online_hotness=True,
    )


@pytest.mark.parametrize(
    "path,value,field",
    [
        (
            "engine",
            {
                "gpuMemoryUtilization": 0.5,
                "maxNumSeqs": 1,
                "maxNumBatchedTokens": 16,
            },
            "spec.engine.gpuMemoryUtilization",
        ),
        ("policy.growThreshold", 2, "spec.policy.growThreshold"),
        ("engine.memoryBudget", "1.5", "spec.engine.memoryBudget"),
        ("engine.evictToAdmit", "no", "spec.engine.evictToAdmit"),
        ("engine.enforceEager", 1, "spec.engine.enforceEager"),
        ("engine.expertCopy", "gpu", "spec.engine.expertCopy"),
        ("engine.cudagraphMode", "piecewise", "spec.engine.cudagraphMode"),
        ("engine.asyncScheduling", "on", "spec.engine.asyncScheduling"),
        ("policy.copyBudget", -1, "spec.policy.copyBudget"),
        ("policy.elasticRule", "greedy", "spec.policy.elasticRule"),
        ("policy.tpotSloMs", -5, "spec.policy.tpotSloMs"),
        ("engine.maxModelLen", 0, "spec.engine.maxModelLen"),
        ("engine.maxWaiting", -1, "spec.engine.maxWaiting"),
        ("engine.fixedExpertShare", 1.5, "spec.engine.fixedExpertShare"),
        ("engine.maxWaiting", 2.5, "spec.engine.maxWaiting"),
        # retired: old objects may set them, to their one value only
        ("engine.blockSize", 32, "spec.engine.blockSize"),
        ("policy.pagesPerExpert", 4, "spec.policy.pagesPerExpert"),
        (
            "dataPlane.resources",
            {"limits": {"amd.com/gpu": "1.5"}},
            "spec.dataPlane.resources.limits['amd.com/gpu']",
        ),
    ],
)
def test_specs_that_can_never_work_name_the_field(tiny_rd, path, value, field):
    # The CRD's CEL rules catch these too; the operator does not rely on them (clusters
    # older than CEL validation, objects written with validation off).
    with pytest.raises(SpecError) as info:
        _parse(_changed(tiny_rd, path, value))
    assert info.value.field == field


@pytest.mark.parametrize("example", ["tiny_rd", "gpu_rd"])
def test_an_object_setting_the_retired_fields_deploys_as_one_without(example, api, request):
    # Objects written for CRD revision 2 or earlier carry blockSize and pagesPerExpert (the
    # API server filled them in): they must stay valid and change nothing.
    rd = request.getfixturevalue(example)
    assert "blockSize" not in rd["spec"]["engine"]
    assert "pagesPerExpert" not in rd["spec"]["policy"]
    old = _changed(_changed(rd, "engine.blockSize", 16), "policy.pagesPerExpert", 3)
    admitted, errors = api.admit(copy.deepcopy(old))
    assert errors == []
    assert (
        admitted["spec"]["engine"]["blockSize"],
        admitted["spec"]["policy"]["pagesPerExpert"],
    ) == (
        16,
        3,
    )
    assert _parse(old) == _parse(rd)
    assert build_children(_parse(old), CONFIG) == build_children(_parse(rd), CONFIG)


def test_missing_defaults_mean_an_old_crd(tiny_rd):
    rd = copy.deepcopy(tiny_rd)
    del rd["spec"]["engine"]["maxNumSeqs"]
    with pytest.raises(SpecError, match="upgrade the rimuru-operator chart"):
        _parse(rd)


def test_long_name_is_refused(tiny_rd):
    rd = copy.deepcopy(tiny_rd)
    rd["metadata"]["name"] = "n" * 51
    with pytest.raises(SpecError, match="at most 50 characters"):
        _parse(rd)


@pytest.mark.parametrize(
    "changes, says",
    [
        ({"engine.tensorParallelSize": 2}, "runs on one GPU"),
        ({"engine.expertCopy": "host", "policy.mode": "elastic"}, "needs expertCopy device"),
        ({"engine.expertCopy": "host", "policy.mode": "fixed"}, "needs expertCopy device"),
    ],
)
def test_async_scheduling_is_refused_where_the_engine_would_refuse_it(tiny_rd, changes, says):
    rd = _changed(tiny_rd, "engine.asyncScheduling", True)
    for path, value in changes.items():
        rd = _changed(rd, path, value)
    with pytest.raises(SpecError, match=says) as info:
        _parse(rd)
    assert info.value.field == "spec.engine.asyncScheduling"
    # unset (auto) the engine leaves it off there: the same spec is accepted
    del rd["spec"]["engine"]["asyncScheduling"]
    assert _parse(rd).engine.async_scheduling is None


def test_token_checksums_roll_the_pods_that_read_a_token_and_reveal_no_token(tiny_rd):
    import hashlib

    from rimuru.operator.builders import Tokens, with_token_checksums

    def stamped(tokens: Tokens) -> dict[str, str]:
        return {
            c["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]: c["spec"][
                "template"
            ]["metadata"]["annotations"]["rimuru.dev/token-checksum"]
            for c in with_token_checksums(build_children(_parse(tiny_rd), CONFIG), tokens)
            if c["kind"] == "Deployment"
        }

    before = stamped(Tokens("chosen-by-a-user", "generated-at-random"))
    after_operator = stamped(Tokens("rotated", "generated-at-random"))
    assert after_operator["controlplane"] != before["controlplane"]
    assert after_operator["dataplane"] == before["dataplane"]  # data planes read only theirs
    plain = hashlib.sha256(b"chosen-by-a-user").hexdigest()[:16]
    assert plain not in before.values()  # keyed by the generated token: nothing to guess
