"""The RimuruDeployment CRD: valid as a Kubernetes object, structural, and its schema
(types, ranges, enums, CEL rules) accepts the examples and rejects broken specs."""

from __future__ import annotations

import copy
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

EXAMPLES = sorted((Path(__file__).parents[2] / "helm/rimuru-operator/examples").glob("*.yaml"))


def test_crd_is_a_valid_kubernetes_object(api):
    crd = api.load_crd()
    kubernetes_validate.validate(crd, api.kube_version, strict=True)
    names = crd["spec"]["names"]
    assert (crd["spec"]["group"], crd["spec"]["scope"]) == ("rimuru.dev", "Namespaced")
    assert (names["kind"], names["plural"], names["shortNames"]) == (
        "RimuruDeployment",
        "rimurudeployments",
        ["rd"],
    )
    (version,) = crd["spec"]["versions"]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"] == {
        "status": {},
        "scale": {
            "specReplicasPath": ".spec.dataPlane.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        },
    }
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["Ready"] == ".status.readyReplicas"
    assert columns["Policy"] == ".status.policy.appliedVersion"
    assert columns["Phase"] == ".status.phase"
    assert columns["Age"] == ".metadata.creationTimestamp"


def _walk(node, path=""):
    yield path, node
    for key, sub in (node.get("properties") or {}).items():
        yield from _walk(sub, f"{path}.{key}")
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            yield from _walk(node[key], f"{path}[{key}]")


def test_schema_is_structural_and_columns_resolve(api):
    schema = api.crd_schema()
    for path, node in _walk(schema):
        # Structural: every node has a type, or is an int-or-string.
        assert "type" in node or node.get("x-kubernetes-int-or-string"), path
    paths = {path for path, _ in _walk(schema)}
    (version,) = api.load_crd()["spec"]["versions"]
    for column in version["additionalPrinterColumns"]:
        assert column["jsonPath"] in paths | {".metadata.creationTimestamp"}, column
    scale = version["subresources"]["scale"]
    assert {
        scale["specReplicasPath"],
        scale["statusReplicasPath"],
        scale["labelSelectorPath"],
    } <= paths


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_are_accepted(api, path):
    obj, errors = api.admit(yaml.safe_load(path.read_text()))
    assert errors == []
    # Defaults were applied where the example is silent.
    assert obj["spec"]["policy"]["mode"] == "elastic"


def test_defaults_fill_an_almost_empty_spec(api):
    obj, errors = api.admit(_rd({"model": {"preset": "tiny"}}))
    assert errors == [
        "spec.engine.gpuMemoryUtilization needs a GPU: set spec.dataPlane.resources.limits['nvidia.com/gpu'] (or amd.com/gpu, nvidia.com/mig-*) above 0, or use spec.engine.memoryBudget"
    ]
    spec = obj["spec"]
    assert spec["engine"] == {
        "gpuMemoryUtilization": 0.9,
        "maxNumSeqs": 256,
        "maxNumBatchedTokens": 8192,
    }
    assert spec["policy"] == {
        "mode": "elastic",
        "expertOffloadLimit": 8,
        "shrinkThreshold": 2,
        "growThreshold": 9,
        "maxGrowPerRound": 5,
        "onlineHotness": False,
        "copyBudget": 0,
        "elasticRule": "cost",
        "tpotSloMs": 0,
    }
    assert spec["dataPlane"]["replicas"] == 1
    assert spec["dataPlane"]["httpPort"] == 8000  # the OpenAI-compatible API is on
    assert spec["controlPlane"]["storage"] == {"enabled": True, "size": "1Gi"}


def _rd(spec, name="demo"):
    return {
        "apiVersion": "rimuru.dev/v1alpha1",
        "kind": "RimuruDeployment",
        "metadata": {"name": name},
        "spec": spec,
    }


def _valid_spec():
    return {"model": {"preset": "tiny"}, "engine": {"memoryBudget": "1Gi"}}


def _with(path: str, value):
    spec = _valid_spec()
    node = spec
    *parents, leaf = path.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value
    return spec


INVALID = {
    "preset and path": (
        _with("model.path", "m"),
        "set exactly one of spec.model.preset or spec.model.path",
    ),
    "neither preset nor path": (
        {"model": {"dtype": "bfloat16"}, "engine": {"memoryBudget": "1Gi"}},
        "set exactly one of spec.model.preset or spec.model.path",
    ),
    "path without volume": (
        {"model": {"path": "m"}, "engine": {"memoryBudget": "1Gi"}},
        "spec.model.path needs spec.model.volume",
    ),
    "two volume sources": (
        {
            "model": {
                "path": "m",
                "volume": {"hostPath": {"path": "/w"}, "persistentVolumeClaim": {"claimName": "w"}},
            },
            "engine": {"memoryBudget": "1Gi"},
        },
        "set exactly one of persistentVolumeClaim, hostPath or image",
    ),
    "budget and utilization": (
        _with("engine.gpuMemoryUtilization", 0.5),
        "set exactly one of spec.engine.memoryBudget or spec.engine.gpuMemoryUtilization",
    ),
    "utilization without a GPU": (
        {"model": {"preset": "tiny"}, "engine": {"gpuMemoryUtilization": 0.5}},
        "spec.engine.gpuMemoryUtilization needs a GPU",
    ),
    "utilization with zero GPUs": (
        {
            "model": {"preset": "tiny"},
            "engine": {"gpuMemoryUtilization": 0.5},
            "dataPlane": {"resources": {"limits": {"nvidia.com/gpu": 0}}},
        },
        "spec.engine.gpuMemoryUtilization needs a GPU",
    ),
    "fixed expert share above 1": (
        _with("engine.fixedExpertShare", 1.5),
        "1.5 is greater than the maximum of 1",
    ),
    "negative max waiting": (_with("engine.maxWaiting", -1), "-1 is less than the minimum of 0"),
    "utilization above 1": (
        _with("engine.gpuMemoryUtilization", 1.5),
        "1.5 is greater than the maximum of 1",
    ),
    "grow not above shrink": (
        _with("policy", {"shrinkThreshold": 9, "growThreshold": 9}),
        "spec.policy.growThreshold must be greater than spec.policy.shrinkThreshold",
    ),
    "resident with offloading": (
        _with("policy", {"mode": "resident"}),
        "mode resident keeps every expert in the pool",
    ),
    "unknown mode": (_with("policy", {"mode": "dynamic"}), "'dynamic' is not one of"),
    # retired: the engine has one layout (w1, w3, w2); old objects may still set it to 3
    "pages per expert 4": (_with("policy", {"pagesPerExpert": 4}), "4 is not one of [3]"),
    "copy budget outside elastic": (
        _with("policy", {"mode": "fixed", "copyBudget": 2.0}),
        "spec.policy.copyBudget applies only to mode elastic",
    ),
    "tpot SLO with the paper's rule": (
        _with("policy", {"elasticRule": "paper", "tpotSloMs": 50.0}),
        "spec.policy.tpotSloMs applies only to mode elastic with elasticRule cost",
    ),
    "unknown elastic rule": (_with("policy", {"elasticRule": "greedy"}), "'greedy' is not one of"),
    "nine ranks": (_with("engine.tensorParallelSize", 9), "9 is greater than the maximum of 8"),
    "negative offload limit": (
        _with("policy", {"expertOffloadLimit": -1}),
        "-1 is less than the minimum of 0",
    ),
    "zero max grow": (_with("policy", {"maxGrowPerRound": 0}), "0 is less than the minimum of 1"),
    "block size 32": (_with("engine.blockSize", 32), "32 is not one of [16]"),  # retired too
    "bad budget quantity": (_with("engine.memoryBudget", "lots"), "'lots' does not match"),
    "negative replicas": (_with("dataPlane", {"replicas": -1}), "-1 is less than the minimum of 0"),
    "replicas as string": (_with("dataPlane", {"replicas": "2"}), "'2' is not of type 'integer'"),
    "short startup timeout": (
        _with("dataPlane", {"startupTimeoutSeconds": 5}),
        "5 is less than the minimum of 30",
    ),
    "privileged HTTP port": (
        _with("dataPlane", {"httpPort": 80}),
        "spec.dataPlane.httpPort must be 0 (off) or a port from 1024 to 65535",
    ),
    "HTTP port on the gRPC port": (
        _with("dataPlane", {"httpPort": 50051}),
        "other than 50051 (gRPC) and 9464 (metrics)",
    ),
    "HTTP port on the metrics port": (
        _with("dataPlane", {"httpPort": 9464}),
        "other than 50051 (gRPC) and 9464 (metrics)",
    ),
    "HTTP port above 65535": (
        _with("dataPlane", {"httpPort": 70000}),
        "70000 is greater than the maximum of 65535",
    ),
    "HTTP port as string": (
        _with("dataPlane", {"httpPort": "8000"}),
        "'8000' is not of type 'integer'",
    ),
    "bad toleration operator": (
        _with("dataPlane", {"tolerations": [{"key": "k", "operator": "In"}]}),
        "'In' is not one of",
    ),
    "bad dtype": (_with("model.dtype", "int8"), "'int8' is not one of"),
    "async scheduling with tensor parallel": (
        _with(
            "engine", {**_valid_spec()["engine"], "asyncScheduling": True, "tensorParallelSize": 2}
        ),
        "spec.engine.asyncScheduling runs on one GPU",
    ),
    "unknown field": (_with("engine.maxSeqs", 3), "'maxSeqs' was unexpected"),
    "ranking without a ConfigMap name": (
        _with("policy", {"ranking": {"key": "r.json"}}),
        "'configMapName' is a required property",
    ),
    "bad GPU quantity": (
        _with("dataPlane", {"resources": {"limits": {"nvidia.com/gpu": "one"}}}),
        "'one' does not match",
    ),
}


@pytest.mark.parametrize("spec,message", INVALID.values(), ids=INVALID.keys())
def test_invalid_specs_are_rejected(api, spec, message):
    _, errors = api.admit(_rd(copy.deepcopy(spec)))
    assert any(message in e for e in errors), errors


@pytest.mark.parametrize(
    "name,message",
    [
        ("a" * 51, "metadata.name must be at most 50 characters"),
        ("9lives", "metadata.name must start with a letter"),
    ],
)
def test_names_children_cannot_carry_are_rejected(api, name, message):
    _, errors = api.admit(_rd(_valid_spec(), name=name))
    assert any(message in e for e in errors), errors


@pytest.mark.parametrize("port", [0, 1024, 8000, 65535])
def test_http_port_off_or_unprivileged_is_accepted(api, port):
    obj, errors = api.admit(_rd(_with("dataPlane", {"httpPort": port})))
    assert errors == []
    assert obj["spec"]["dataPlane"]["httpPort"] == port


def test_missing_spec_is_rejected(api):
    _, errors = api.admit(
        {"apiVersion": "rimuru.dev/v1alpha1", "kind": "RimuruDeployment", "metadata": {"name": "x"}}
    )
    assert errors == [": 'spec' is a required property"]


@pytest.mark.parametrize(
    "limits",
    [{"nvidia.com/gpu": 1}, {"amd.com/gpu": "1"}, {"nvidia.com/mig-1g.10gb": 1}],
)
def test_every_gpu_resource_allows_gpu_memory_utilization(api, limits):
    spec = {
        "model": {"preset": "tiny"},
        "engine": {"gpuMemoryUtilization": 0.5},
        "dataPlane": {"resources": {"limits": limits}},
    }
    assert api.admit(_rd(spec))[1] == []


def test_engine_limits_are_in_the_schema(api):
    engine = {"memoryBudget": "1Gi", "maxModelLen": 4096, "maxWaiting": 0, "fixedExpertShare": 0.3}
    obj, errors = api.admit(_rd({"model": {"preset": "tiny"}, "engine": engine}))
    assert errors == []
    assert engine.items() <= obj["spec"]["engine"].items()
