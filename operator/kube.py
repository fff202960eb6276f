"""A small asynchronous Kubernetes API client for the operator's children.

kopf watches the RimuruDeployments; this client reads, creates, patches and deletes
their children (Deployments, Services, ConfigMaps, Secrets, PVCs) and patches their
status from the periodic refresh, on kopf's event loop, with the credentials kopf
logged in with. Only the kinds in `RESOURCES` are known: the operator touches nothing
else (and its RBAC allows no more).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

import aiohttp
import kopf

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


def object_path(kind: str, namespace: str, name: str | None = None) -> str:
    if kind not in RESOURCES:
        raise ValueError(f"unsupported kind {kind!r}; known: {', '.join(RESOURCES)}")
    prefix, plural = RESOURCES[kind]
    path = f"{prefix}/namespaces/{namespace}/{plural}"
    return path if name is None else f"{path}/{name}"


class KubeClient:
    def __init__(self, info: kopf.ConnectionInfo, timeout_s: float = 30.0) -> None:
        self._server = info.server.rstrip("/")
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=info.as_ssl_context()),
            headers={**info.as_http_headers(), "User-Agent": f"rimuru-operator/{os.getpid()}"},
            timeout=aiohttp.ClientTimeout(total=timeout_s),
            trust_env=info.trust_env,
        )
        self._server_version: dict[str, Any] | None = None
        # what the API server stored for this client's writes of each child (apply.py)
        self.stored_shapes: dict = {}

    async def close(self) -> None:
        await self._session.close()

    @property
    def closed(self) -> bool:
        return self._session.closed

    async def _request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        headers = {"Content-Type": content_type} if body is not None else {}
        async with self._session.request(
            method, self._server + path, json=body, headers=headers
        ) as response:
            data = await response.json(content_type=None) if response.content_length != 0 else {}
            if response.status < 400:
                return data or {}
            message = data.get("message", "") if isinstance(data, dict) else str(data)
            if response.status == 404:
                raise NotFound(404, message or f"{path} not found")
            if response.status == 409:
                raise Conflict(409, message)
            raise KubeError(response.status, message or response.reason or "")

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
        path = f"{object_path(kind, namespace)}?labelSelector={quote(selector)}"
        return list((await self._request("GET", path)).get("items") or [])

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
        """Delete one object; False if it was already gone."""
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
