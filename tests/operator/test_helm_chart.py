"""The Helm chart, rendered and linted offline with Helm's own Go SDK (helm-python-sdk),
its output validated against the official Kubernetes schemas, and checked against the
operator it installs (CLI flags, RBAC for every kind the operator touches)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from rimuru.operator import cli
from rimuru.operator.kube import RESOURCES

CHART = Path(__file__).resolve().parents[2] / "helm" / "rimuru-operator"


def render(values: dict | None = None) -> list[dict]:
    with helm.Chart.load(CHART) as chart:
        chart.validate_schema(values)
        files = chart.render(
            values, name="rimuru-operator", namespace="rimuru-system", is_install=True
        )
    docs = []
    for name, text in sorted(files.items()):
        if name.endswith(".yaml"):
            docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


def by_kind(docs: list[dict]) -> dict[str, list[dict]]:
    kinds: dict[str, list[dict]] = {}
    for doc in docs:
        kinds.setdefault(doc["kind"], []).append(doc)
    return kinds


@pytest.mark.parametrize("values", [None, {"watchNamespaces": ["ml", "serving"], "verbose": True}])
def test_lint_is_clean(values):
    report = helm.lint(CHART, values, strict=True, kube_version="v1.33.0")
    assert report["errors"] == []
    # Severity 1 is "info" (e.g. "icon is recommended"); nothing worse.
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize("values", [None, {"watchNamespaces": ["ml", "serving"]}])
def test_rendered_manifests_are_valid_kubernetes(api, values):
    docs = render(values)
    assert docs, "the chart rendered nothing"
    for doc in docs:
        kubernetes_validate.validate(doc, api.kube_version, strict=True)


def _named(docs: list[dict], name: str) -> dict:
    (doc,) = [d for d in docs if d["metadata"]["name"] == name]
    return doc


def test_default_install_objects():
    kinds = by_kind(render())
    assert sorted(kinds) == ["ClusterRole", "ClusterRoleBinding", "Deployment", "ServiceAccount"]
    assert sorted(r["metadata"]["name"] for r in kinds["ClusterRole"]) == [
        "rimuru-operator",
        "rimuru-operator-crd-reader",
    ]
    (deployment,) = kinds["Deployment"]
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "rimuru-operator"
    assert pod["securityContext"]["runAsNonRoot"] is True
    (container,) = pod["containers"]
    assert container["image"] == "ghcr.io/rimuru-dev/rimuru-operator:0.1.0"
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "healthz"}
    binding = _named(kinds["ClusterRoleBinding"], "rimuru-operator")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "rimuru-operator", "namespace": "rimuru-system"}
    ]


def test_operator_accepts_the_chart_args():
    (deployment,) = by_kind(render({"watchNamespaces": ["ml"], "verbose": True}))["Deployment"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[0] == "operator"
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    parsed = parser.parse_args(args[1:])
    assert parsed.namespace == ["ml"]
    assert parsed.liveness_port == 8080
    assert parsed.dataplane_image == "ghcr.io/rimuru-dev/rimuru-dataplane:0.1.0"
    assert parsed.controlplane_image == "ghcr.io/rimuru-dev/rimuru-controlplane:0.1.0"
    assert (parsed.status_interval, parsed.retry_delay, parsed.verbose) == (30.0, 10.0, True)


def test_watched_namespaces_get_role_bindings_only():
    kinds = by_kind(render({"watchNamespaces": ["ml", "serving"]}))
    # Cluster-wide, only the read of the operator's own CRD (cluster-scoped).
    (crd_binding,) = kinds["ClusterRoleBinding"]
    assert crd_binding["roleRef"]["name"] == "rimuru-operator-crd-reader"
    crd_reader = _named(kinds["ClusterRole"], "rimuru-operator-crd-reader")
    assert crd_reader["rules"] == [
        {
            "apiGroups": ["apiextensions.k8s.io"],
            "resources": ["customresourcedefinitions"],
            "resourceNames": ["rimurudeployments.rimuru.dev"],
            "verbs": ["get"],
        }
    ]
    bindings = kinds["RoleBinding"]
    assert [b["metadata"]["namespace"] for b in bindings] == ["ml", "serving"]
    assert all(b["roleRef"]["kind"] == "ClusterRole" for b in bindings)


def test_rbac_covers_exactly_what_the_operator_touches(operator_rbac):
    granted = {
        (group, resource): set(rule["verbs"])
        for role in by_kind(render())["ClusterRole"]
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    assert granted == operator_rbac
    for kind, (prefix, plural) in RESOURCES.items():  # every kind operator/kube.py knows
        group = "" if prefix == "/api/v1" else prefix.split("/")[2]
        assert (group, plural) in granted, kind


def test_chart_ships_the_one_crd():
    with helm.Chart.load(CHART) as chart:
        (crd,) = chart.crds
    assert yaml.safe_load(crd["data"])["metadata"]["name"] == "rimurudeployments.rimuru.dev"


@pytest.mark.parametrize(
    "values,where",
    [
        ({"livenessPort": 0}, "/livenessPort"),
        ({"image": {"repository": "r", "tag": "", "pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
        ({"watchNamespaces": ["Not_A_Namespace"]}, "/watchNamespaces/0"),
        (
            {"securityContext": {"allowPrivilegeEscalation": True}},
            "/securityContext/allowPrivilegeEscalation",
        ),
        ({"replicas": 2}, "additional properties 'replicas'"),
    ],
)
def test_values_schema_rejects(values, where):
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmValuesError, match=where):
        chart.validate_schema(values)


def test_every_values_key_is_commented():
    lines = (CHART / "values.yaml").read_text().splitlines()
    for i, line in enumerate(lines):
        stripped = line.strip()
        if stripped and not stripped.startswith("#") and not stripped.startswith("-"):
            assert lines[i - 1].strip().startswith("#"), f"values.yaml:{i + 1} {stripped!r}"


def test_manifests_in_the_docs_are_valid(api):
    text = (CHART.parents[1] / "docs" / "kubernetes.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, re.DOTALL)
    assert blocks
    for block in blocks:
        doc = yaml.safe_load(block)
        kubernetes_validate.validate(doc, api.kube_version, strict=True)
