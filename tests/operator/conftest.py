"""What a Kubernetes API server does with a RimuruDeployment, reproduced offline.

The CRD is read from the one place it lives (the chart's crds/). `admit()` applies the
schema defaults, validates the structural schema with strict field validation (as
`kubectl apply` does), then evaluates the CEL rules (`x-kubernetes-validations`), and
returns the defaulted object or the list of error messages.
"""

from __future__ import annotations

import copy
import itertools
from pathlib import Path
from typing import Any

import aiohttp
import attrs
import celpy
import jsonpatch
import jsonschema
import kmock
import pytest
import yaml

from rimuru.controlplane.plane import ControlPlane
from rimuru.controlplane.server import create_server
from tests.operator.operator_harness import TOKEN, with_deployment_defaults

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "rimuru-operator"
CRD_PATH = CHART / "crds" / "rimurudeployments.rimuru.dev.yaml"
EXAMPLES = sorted((CHART / "examples").glob("*.yaml"))
KUBE_VERSION = "1.33"  # image volumes (spec.model.volume.image) need >= 1.31


def load_crd() -> dict[str, Any]:
    return yaml.safe_load(CRD_PATH.read_text())


def crd_schema(crd: dict[str, Any] | None = None) -> dict[str, Any]:
    crd = crd or load_crd()
    (version,) = crd["spec"]["versions"]
    return version["schema"]["openAPIV3Schema"]


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """Kubernetes structural defaulting: missing properties with a default get it,
    then defaulting continues inside the value (so `default: {}` fills nested fields)."""
    if isinstance(value, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                apply_defaults(sub, value[key])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key in set(value) - set(schema.get("properties") or {}):
                apply_defaults(extra, value[key])
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for item in value:
            apply_defaults(schema["items"], item)
    return value


def _strict(schema: dict[str, Any]) -> dict[str, Any]:
    # Strict field validation: unknown fields are errors, except under the
    # free-form metadata (the API server validates ObjectMeta itself).
    schema = copy.deepcopy(schema)

    def walk(node: dict[str, Any], path: str) -> None:
        if node.get("type") == "object" and "properties" in node and path != ".metadata":
            node.setdefault("additionalProperties", False)
        for key, sub in (node.get("properties") or {}).items():
            walk(sub, f"{path}.{key}")
        if isinstance(node.get("additionalProperties"), dict):
            walk(node["additionalProperties"], path + "[*]")
        if isinstance(node.get("items"), dict):
            walk(node["items"], path + "[]")

    walk(schema, "")
    return schema


_CEL = celpy.Environment()


def cel_errors(schema: dict[str, Any], value: Any) -> list[str]:
    errors = []
    for rule in schema.get("x-kubernetes-validations") or []:
        program = _CEL.program(_CEL.compile(rule["rule"]))
        if not program.evaluate({"self": celpy.json_to_cel(value)}):
            errors.append(rule["message"])
    if isinstance(value, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key in value:
                errors += cel_errors(sub, value[key])
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for item in value:
            errors += cel_errors(schema["items"], item)
    return errors


def admit(obj: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """(defaulted object, errors); errors empty = the API server would accept it."""
    schema = crd_schema()
    obj = apply_defaults(schema, copy.deepcopy(obj))
    validator = jsonschema.Draft202012Validator(_strict(schema))
    errors = [
        f"{'.'.join(str(p) for p in e.absolute_path)}: {e.message}"
        for e in validator.iter_errors(obj)
    ]
    if not errors:  # CEL runs only on schema-valid objects, as in the API server
        errors = cel_errors(schema, obj)
    return obj, errors


class Admission:
    """The API server's view of the CRD, as a fixture (test modules cannot import conftest)."""

    admit = staticmethod(admit)
    crd_schema = staticmethod(crd_schema)
    load_crd = staticmethod(load_crd)
    kube_version = KUBE_VERSION


# (API group, resource) -> the RBAC verbs the operator uses: kopf (watch the
# RimuruDeployments, patch their finalizer and progress annotations, post events) and
# operator/kube.py, whose children are watched (Deployments, Services, budgets) or read
# by name, and whose Secrets and PVCs are created once, never patched. The chart's ClusterRole grants exactly this
# (test_helm_chart) and the operator, run end to end, calls nothing else (test_operator_e2e).
_CHILD = frozenset({"get", "create", "patch", "delete"})
# children whose live state comes from a watch (operator/live.py), read by name only when
# a create finds one the watch does not show (it lost the label the watch selects on)
_WATCHED_CHILD = _CHILD | {"list", "watch"}
OPERATOR_RBAC: dict[tuple[str, str], frozenset[str]] = {
    ("rimuru.dev", "rimurudeployments"): frozenset({"list", "watch", "patch"}),
    ("rimuru.dev", "rimurudeployments/status"): frozenset({"patch"}),
    # children carry ownerReferences with blockOwnerDeletion, which needs this
    ("rimuru.dev", "rimurudeployments/finalizers"): frozenset({"update"}),
    ("apps", "deployments"): _WATCHED_CHILD,
    ("", "services"): _WATCHED_CHILD,
    # engine ConfigMaps are named by content: listed by label to prune the old ones
    ("", "configmaps"): _CHILD | {"list"},
    ("autoscaling", "horizontalpodautoscalers"): _CHILD,
    ("policy", "poddisruptionbudgets"): _WATCHED_CHILD,
    ("", "persistentvolumeclaims"): frozenset({"get", "create", "delete"}),
    ("", "secrets"): frozenset({"get", "create", "delete"}),
    ("", "events"): frozenset({"create"}),
    # the data-plane pods' status: why a model does not load (operator/pod_failures.py)
    ("", "pods"): frozenset({"list", "watch"}),
    # its own CRD, read once at start for its revision (operator/crd.py)
    ("apiextensions.k8s.io", "customresourcedefinitions"): frozenset({"get"}),
}


@pytest.fixture
def operator_rbac() -> dict[tuple[str, str], frozenset[str]]:
    return OPERATOR_RBAC


@pytest.fixture
def api() -> Admission:
    return Admission()


@pytest.fixture
def tiny_rd() -> dict[str, Any]:
    """The tiny CPU example as a stored object (defaulted, with server-set metadata)."""
    obj = yaml.safe_load((CHART / "examples" / "tiny-cpu.yaml").read_text())
    obj, errors = admit(obj)
    assert errors == []
    obj["metadata"].update(namespace="default", uid="uid-tiny-1", generation=1)
    return obj


@pytest.fixture
def gpu_rd() -> dict[str, Any]:
    obj = yaml.safe_load((CHART / "examples" / "qwen-moe-h200.yaml").read_text())
    obj, errors = admit(obj)
    assert errors == []
    obj["metadata"].update(namespace="serving", uid="uid-qwen-1", generation=3)
    return obj


@pytest.fixture
def kube_api(kmock, tmp_path, monkeypatch):
    """The kmock emulator set up as the API server of a cluster with the CRD installed,
    and KUBECONFIG pointing at it (for the operator in-process or as a subprocess)."""
    kmock.resources["rimuru.dev/v1alpha1/rimurudeployments"] = kmock.ResourceInfo(
        kind="RimuruDeployment",
        singular="rimurudeployment",
        namespaced=True,
        shortnames={"rd"},
        verbs={"get", "list", "watch", "create", "patch", "delete"},
        subresources={"status", "scale"},
    )
    # What every API server's discovery lists and kopf's core machinery looks up.
    kmock.resources["v1/namespaces"] = kmock.ResourceInfo(kind="Namespace", namespaced=False)
    kmock.resources["v1/events"] = kmock.ResourceInfo(kind="Event", namespaced=True)
    kmock.resources["apiextensions.k8s.io/v1/customresourcedefinitions"] = kmock.ResourceInfo(
        kind="CustomResourceDefinition", namespaced=False
    )
    # The children the operator watches (operator/live.py), and the engine ConfigMaps it
    # lists to prune.
    for resource, kind in (
        ("v1/configmaps", "ConfigMap"),
        ("apps/v1/deployments", "Deployment"),
        ("v1/services", "Service"),
        ("policy/v1/poddisruptionbudgets", "PodDisruptionBudget"),
        ("v1/pods", "Pod"),
    ):
        kmock.resources[resource] = kmock.ResourceInfo(
            kind=kind, namespaced=True, verbs={"get", "list", "watch", "create", "patch", "delete"}
        )
    # The chart's CRD as installed: the operator checks its revision at start.
    crd = load_crd()
    kmock.objects[
        "apiextensions.k8s.io/v1/customresourcedefinitions", None, crd["metadata"]["name"]
    ] = crd
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "kmock", "cluster": {"server": str(kmock.url).rstrip("/")}}],
        "users": [{"name": "op", "user": {"token": "operator-sa-token"}}],
        "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "op"}}],
        "current-context": "kmock",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig))
    monkeypatch.setenv("KUBECONFIG", str(path))
    return kmock


def _merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (what kmock applies to a dict body)."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge_patch(result.get(key), value)
    return result


def _merge_diff(current: Any, wanted: Any) -> Any:
    """The RFC 7386 merge patch that turns `current` into `wanted`."""
    if not isinstance(current, dict) or not isinstance(wanted, dict):
        return wanted
    diff = {key: None for key in current if key not in wanted}
    diff.update({key: _merge_diff(current.get(key), value) for key, value in wanted.items()})
    return diff


@attrs.define(kw_only=True)
class VersionedKubernetesEmulator(kmock.KubernetesEmulator):
    """kmock's emulator plus what the API server does with versions: every write gets a
    new metadata.resourceVersion (and a create a uid), a list reports the latest, a
    watch from version X sends only later events, and a JSON patch whose `test` of the
    version fails is a 422. kopf relies on these to tell its own fresh writes from stale
    events. metadata.generation starts at 1 and a write that changes the spec (not one
    to the status subresource) increments it, so a Deployment's status is stale until
    the test, playing its controller, sets status.observedGeneration."""

    _versions: itertools.count = attrs.field(factory=lambda: itertools.count(100), init=False)
    _latest: int = attrs.field(default=0, init=False)
    # object name -> the message of a 422 that every create or update of it gets, as from
    # field validation or an admission policy; `num_rejected` counts those writes
    invalid: dict[str, str] = attrs.field(factory=dict, init=False)
    num_rejected: int = attrs.field(default=0, init=False)
    # the message of a 422 that every status write of a RimuruDeployment gets, as from a CRD
    # whose schema lacks a field the operator writes; None = accepted
    invalid_status: str | None = attrs.field(default=None, init=False)
    # (key, value) that the emulated API server adds to every stored Deployment's pod spec,
    # as a newer server's default the operator's list does not know; None = none
    unlisted_pod_default: tuple[str, Any] | None = attrs.field(default=None, init=False)

    async def _handle(self, request):
        if self.invalid_status is not None and self._is_status_write(request):
            raise kmock.KubernetesError(status=422, reason="Invalid", message=self.invalid_status)
        if self._is_deployment_write(request):
            self._add_defaults(request)
        if self._rejects(request):
            self.num_rejected += 1
            raise kmock.KubernetesError(
                status=422, reason="Invalid", message=self.invalid[self._target_name(request)]
            )
        if request.resource is not None and request.action in (
            kmock.action.CREATE,
            kmock.action.UPDATE,
        ):
            self._latest = next(self._versions)
            version = str(self._latest)
            generation = self._next_generation(request)
            if isinstance(request.data, dict):
                meta = request.data.setdefault("metadata", {})
                meta["resourceVersion"] = version
                if request.action == kmock.action.CREATE:
                    meta.setdefault("uid", f"uid-{version}")
                if generation is not None:
                    meta["generation"] = generation
            elif isinstance(request.data, list):  # a JSON patch
                request.data.append(
                    {"op": "add", "path": "/metadata/resourceVersion", "value": version}
                )
                if generation is not None:
                    request.data.append(
                        {"op": "add", "path": "/metadata/generation", "value": generation}
                    )
        return await super()._handle(request)

    def _stored(self, deployment: dict) -> dict:
        stored = with_deployment_defaults(deployment)
        pod = stored["spec"].get("template", {}).get("spec")
        if self.unlisted_pod_default is not None and isinstance(pod, dict):
            pod.setdefault(*self.unlisted_pod_default)
        return stored

    def _is_status_write(self, request) -> bool:
        return (
            request.resource is not None
            and request.resource.plural == "rimurudeployments"
            and request.subresource == "status"
            and request.action == kmock.action.UPDATE
        )

    def _is_deployment_write(self, request) -> bool:
        return (
            request.resource is not None
            and request.resource.plural == "deployments"
            and request.subresource is None
            and request.action in (kmock.action.CREATE, kmock.action.UPDATE)
        )

    def _add_defaults(self, request) -> None:
        """Rewrite the write (in place: a request is frozen) so that what is stored carries
        the API server's defaults: a created object defaulted; a patch made one that leaves
        the defaulted result."""
        if request.action == kmock.action.CREATE:
            request.data.update(self._stored(request.data))
            return
        before_and_after = self._before_and_after(request)
        if before_and_after is None:
            return  # refused as it is
        current, patched = before_and_after
        stored = self._stored(patched)
        if isinstance(request.data, list):
            request.data.extend(
                {"op": "add", "path": f"/{part}", "value": stored[part]}
                for part in ("metadata", "spec")
            )
        else:
            for part in ("metadata", "spec"):
                request.data[part] = _merge_diff(current.get(part), stored[part])

    def _before_and_after(self, request) -> tuple[dict, dict] | None:
        """The stored object and what a patch request makes of it; None if there is none
        or the patch does not apply (the write fails anyway)."""
        key = (request.resource, request.namespace, request.name)
        if key not in self.objects or self.objects[key].deleted:
            return None
        current = copy.deepcopy(self.objects[key].raw)
        try:
            if isinstance(request.data, list):
                return current, jsonpatch.apply_patch(current, request.data)
            return current, _merge_patch(current, request.data)
        except jsonpatch.JsonPatchException:
            return None

    def _target_name(self, request) -> str | None:
        if request.action == kmock.action.CREATE and isinstance(request.data, dict):
            return request.data.get("metadata", {}).get("name")
        return request.name

    def _rejects(self, request) -> bool:
        return (
            request.resource is not None
            and request.subresource is None
            and request.action in (kmock.action.CREATE, kmock.action.UPDATE)
            and self._target_name(request) in self.invalid
        )

    def _next_generation(self, request) -> int | None:
        """The generation this write leaves; None = unchanged (or not the emulator's
        to decide: the write fails anyway)."""
        if request.action == kmock.action.CREATE:
            return 1  # whatever the client sent, as the API server does
        if request.subresource is not None:
            return None
        before_and_after = self._before_and_after(request)
        if before_and_after is None:
            return None
        current, updated = before_and_after
        if updated.get("spec") == current.get("spec"):
            return None
        return int(current.get("metadata", {}).get("generation") or 0) + 1

    async def _serve_list(self, request):
        payload = await super()._serve_list(request)
        payload["metadata"]["resourceVersion"] = str(self._latest)
        return payload

    async def _serve_watch(self, request):
        since = request.params.get("resourceVersion", "")
        since = int(since) if since.isdigit() else 0
        async for event in super()._serve_watch(request):
            if isinstance(event, dict):
                version = event.get("object", {}).get("metadata", {}).get("resourceVersion", "")
                if version.isdigit() and int(version) <= since:
                    continue  # the list already showed it
            yield event

    async def _render_error(self, exc: Exception):
        if isinstance(exc, jsonpatch.JsonPatchTestFailed):
            exc = kmock.KubernetesError(status=422, reason="Invalid", message=str(exc))
        return await super()._render_error(exc)


@pytest.fixture
def kmock_options(kmock_options):
    return {**kmock_options, "cls": VersionedKubernetesEmulator}


# The end-to-end harness's fixtures (operator_harness.py): a real control plane on port 0,
# and the operator's environment against the kmock API server.
@pytest.fixture
async def control_plane(tmp_path):
    plane = ControlPlane.open(tmp_path / "cp")
    server, port = await create_server("127.0.0.1:0", plane, token=TOKEN)
    await server.start()
    yield f"127.0.0.1:{port}"
    await server.stop(None)
    plane.close()


@pytest.fixture
async def env(kube_api, control_plane, monkeypatch):
    # Out of cluster the operator dials the control plane directly, as in development.
    monkeypatch.setenv("RIMURU_OPERATOR_CONTROLPLANE_TARGET", control_plane)
    monkeypatch.setenv("RIMURU_OPERATOR_STATUS_INTERVAL_SECONDS", "0.2")
    monkeypatch.setenv("RIMURU_OPERATOR_RETRY_DELAY_SECONDS", "0.2")
    monkeypatch.setenv("RIMURU_OPERATOR_DATAPLANE_IMAGE", "reg/dp:e2e")
    monkeypatch.setenv("RIMURU_OPERATOR_CONTROLPLANE_IMAGE", "reg/cp:e2e")
    async with aiohttp.ClientSession(base_url=str(kube_api.url)) as http:
        yield http
