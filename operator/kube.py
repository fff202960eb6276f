"""The operator's Kubernetes API client for its children, on kubernetes_asyncio.

kopf watches the RimuruDeployments; this client reads, creates, patches and deletes
their children (Deployments, Services, ConfigMaps, Secrets, PVCs) and patches their
status from the periodic refresh, on kopf's event loop. Only the kinds in `RESOURCES`
are known: the operator touches nothing else (and its RBAC allows no more).

Requests go through the library's generic `ApiClient.call_api`, not its typed models:
an object comes back as the API server's JSON, so a field the generated models do not
know (a newer server's, or a default) is neither dropped nor renamed, and what apply.py
compares is what the server stored.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import kopf
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

# kind -> (API path prefix, plural)
RESOURCES: dict[str, tuple[str, str]] = {
    "ConfigMap": ("/api/v1", "configmaps"),
    "Secret": ("/api/v1", "secrets"),
    "Service": ("/api/v1", "services"),
    "PersistentVolumeClaim": ("/api/v1", "persistentvolumeclaims"),
    "Deployment": ("/apis/apps/v1", "deployments"),
    "Pod": ("/api/v1", "pods"),
    "PodDisruptionBudget": ("/apis/policy/v1", "poddisruptionbudgets"),
    "HorizontalPodAutoscaler": ("/apis/autoscaling/v2", "horizontalpodautoscalers"),
    "RimuruDeployment": ("/apis/rimuru.dev/v1alpha1", "rimurudeployments"),
}


CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"

# The library logs every response body at DEBUG, the token Secrets' included: a verbose
# operator must not print its tokens.
logging.getLogger("kubernetes_asyncio.client.rest").setLevel(logging.INFO)


class KubeError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


class NotFound(KubeError):
    pass


class Conflict(KubeError):
    pass


# how to provide credentials, for every message that finds none usable
CREDENTIALS_HINT = (
    "run in a pod with a service account, or set KUBECONFIG (or ~/.kube/config) when "
    "running the operator outside the cluster."
)


def connection_info(settings: kopf.OperatorSettings) -> kopf.ConnectionInfo:
    """Credentials in the order kopf documents: in-cluster service account, then kubeconfig."""
    info = kopf.login_with_service_account(settings=settings) or kopf.login_with_kubeconfig(
        settings=settings
    )
    if info is None:
        raise kopf.LoginError(f"No Kubernetes credentials: {CREDENTIALS_HINT}")
    return info


async def load_configuration() -> client.Configuration:
    """The client's credentials, found in the order kopf logs in (connection_info): the
    in-cluster service account (whose token the library re-reads as the kubelet rotates
    it), then the kubeconfig."""
    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException:
        try:
            # KUBECONFIG read now: the library reads it once, when first imported
            path = os.environ.get("KUBECONFIG") or "~/.kube/config"
            await config.load_kube_config(config_file=path, client_configuration=configuration)
        except config.ConfigException as exc:
            raise kopf.LoginError(
                f"No usable Kubernetes credentials ({exc}): {CREDENTIALS_HINT}"
            ) from exc
    return configuration


def object_path(kind: str, namespace: str, name: str | None = None) -> str:
    if kind not in RESOURCES:
        raise ValueError(f"unsupported kind {kind!r}; known: {', '.join(RESOURCES)}")
    prefix, plural = RESOURCES[kind]
    path = f"{prefix}/namespaces/{namespace}/{plural}"
    return path if name is None else f"{path}/{name}"


def _error(exc: ApiException, path: str) -> KubeError:
    """The API server's refusal as the operator's error: its Status message, if any."""
    try:
        status = json.loads(exc.body or "")
        message = status.get("message", "") if isinstance(status, dict) else str(status)
    except ValueError:
        message = str(exc.body or "")
    if exc.status == 404:
        return NotFound(404, message or f"{path} not found")
    if exc.status == 409:
        return Conflict(409, message)
    return KubeError(exc.status, message or exc.reason or "")


class KubeClient:
    def __init__(self, configuration: client.Configuration, timeout_s: float = 30.0) -> None:
        self._api = client.ApiClient(configuration)
        self._api.user_agent = f"rimuru-operator/{os.getpid()}"
        self._timeout_s = timeout_s
        self._server_version: dict[str, Any] | None = None
        # what the API server stored for this client's writes of each child (apply.py)
        self.stored_shapes: dict = {}
        self._closed = False

    async def close(self) -> None:
        self._closed = True
        await self._api.close()

    @property
    def closed(self) -> bool:
        return self._closed

    async def _request(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, str]] = (),
        body: Any = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        try:
            data = await self._api.call_api(
                path,
                method,
                query_params=list(query),
                header_params={"Accept": "application/json", "Content-Type": content_type},
                body=body,
                # 'object': the decoded JSON as it came, not a generated model
                response_types_map={200: "object", 201: "object", 202: "object"},
                auth_settings=["BearerToken"],
                _return_http_data_only=True,
                _request_timeout=self._timeout_s,
            )
        except ApiException as exc:
            raise _error(exc, path) from None
        return data if isinstance(data, dict) else {}

    async def server_version(self) -> dict[str, Any]:
        """The API server's /version (readable by every authenticated client), asked
        once: an upgraded cluster restarts its pods, this one included."""
        if self._server_version is None:
            self._server_version = await self._request("GET", "/version")
        return self._server_version

    async def get_crd(self, name: str) -> dict[str, Any] | None:
        """A CustomResourceDefinition (cluster-scoped); None if not installed."""
        try:
            return await self._request("GET", f"{CRD_PATH}/{name}")
        except NotFound:
            return None

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return await self._request("GET", object_path(kind, namespace, name))
        except NotFound:
            return None

    async def list(
        self, kind: str, namespace: str, labels: Mapping[str, str]
    ) -> list[dict[str, Any]]:
        """The objects of `kind` in `namespace` that carry all of `labels`."""
        selector = ",".join(f"{k}={v}" for k, v in labels.items())
        found = await self._request(
            "GET", object_path(kind, namespace), query=[("labelSelector", selector)]
        )
        return list(found.get("items") or [])

    async def get_from_server(self, kind: str, namespace: str, name: str) -> dict | None:
        """The same as get(); callers that read through a cache (live.LiveKube) use it
        where only the server's answer will do."""
        return await self.get(kind, namespace, name)

    async def create(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        return await self._request(
            "POST", object_path(obj["kind"], meta["namespace"]), body=dict(obj)
        )

    async def json_patch(
        self, kind: str, namespace: str, name: str, operations: Sequence[Mapping[str, Any]]
    ) -> dict[str, Any]:
        return await self._request(
            "PATCH",
            object_path(kind, namespace, name),
            body=[dict(op) for op in operations],
            content_type="application/json-patch+json",
        )

    async def patch_status(
        self, kind: str, namespace: str, name: str, status: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Merge-patch the status subresource (lists inside are replaced whole)."""
        return await self._request(
            "PATCH",
            object_path(kind, namespace, name) + "/status",
            body={"status": dict(status)},
            content_type="application/merge-patch+json",
        )

    async def delete(self, kind: str, namespace: str, name: str) -> bool:
        """Delete one object; False if it was already gone. What the server stored for the
        operator's last write of it goes too (a deployment's pruned ConfigMaps and deleted
        children would otherwise stay in `stored_shapes` for the operator's lifetime)."""
        self.stored_shapes.pop((kind, namespace, name), None)
        try:
            # Background: the garbage collector removes the Deployment's pods afterwards.
            await self._request(
                "DELETE",
                object_path(kind, namespace, name),
                body={"propagationPolicy": "Background"},
            )
        except NotFound:
            return False
        return True
