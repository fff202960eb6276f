"""The children's live state, read without asking the API server where possible.

    Deployment, Service, PodDisruptionBudget, Pod -> kopf's watch-fed indices (handlers.py)
    Secret (the token)                        -> kept from the last read, per process
    anything else (ConfigMap, PVC)            -> a GET

`LiveKube` has KubeClient's interface, so reconcile and apply read through it unchanged;
writes go straight to the API server and come back through the watches. Secrets are not
watched: that would need list and watch on every Secret the operator may see. The token
is read again on every spec change (`fresh_secrets`) and after the control plane refuses
it (`forget`), which is also when a rotated token matters.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, MutableMapping
from typing import Any

from rimuru.operator.kube import KubeClient

# kind -> (API group, version, plural) of the children the operator watches
WATCHED: dict[str, tuple[str, str, str]] = {
    "Deployment": ("apps", "v1", "deployments"),
    "Service": ("", "v1", "services"),
    "PodDisruptionBudget": ("policy", "v1", "poddisruptionbudgets"),
    # not the operator's children but the data-plane Deployments' (their template carries
    # the same labels): their status says why a model does not load
    "Pod": ("", "v1", "pods"),
}


def index_name(kind: str) -> str:
    """The kopf index (and handler-argument) name of a watched kind."""
    return f"live_{WATCHED[kind][2]}"


# (namespace, name) -> the object; the value of one watched object in its kind's index
IndexKey = tuple[str, str]


class LiveKube:
    def __init__(
        self,
        kube: KubeClient,
        indices: Mapping[str, Mapping[IndexKey, Any]],
        secrets: MutableMapping[IndexKey, dict[str, Any]],
        *,
        fresh_secrets: bool,
    ) -> None:
        """`indices`: kind -> kopf index of that kind (a key maps to a store of one
        object); `secrets`: the per-process Secret cache this pass reads and fills."""
        self._kube = kube
        # kept by the process's one KubeClient, across passes (apply.py)
        self.stored_shapes = kube.stored_shapes
        self._indices = indices
        self._secrets = secrets
        self._fresh_secrets = fresh_secrets

    @property
    def closed(self) -> bool:
        return self._kube.closed

    def forget(self, namespace: str, name: str) -> None:
        self._secrets.pop((namespace, name), None)

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        if kind in self._indices:
            store = self._indices[kind].get((namespace, name))
            return None if not store else copy.deepcopy(next(iter(store)))
        if kind == "Secret" and not self._fresh_secrets and (namespace, name) in self._secrets:
            return self._secrets[namespace, name]
        obj = await self._kube.get(kind, namespace, name)
        if kind == "Secret":
            if obj is None:
                self.forget(namespace, name)
            else:
                self._secrets[namespace, name] = obj
        return obj

    async def list(
        self, kind: str, namespace: str, labels: Mapping[str, str]
    ) -> list[dict[str, Any]]:
        if kind not in self._indices:
            return await self._kube.list(kind, namespace, labels)
        return [
            copy.deepcopy(obj)
            for (obj_namespace, _), store in self._indices[kind].items()
            if obj_namespace == namespace
            for obj in store
            if labels.items() <= (obj.get("metadata", {}).get("labels") or {}).items()
        ]

    async def get_from_server(self, kind: str, namespace: str, name: str) -> dict | None:
        return await self._kube.get(kind, namespace, name)

    async def server_version(self) -> dict[str, Any]:
        return await self._kube.server_version()

    async def create(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        return await self._kube.create(obj)

    async def json_patch(self, kind: str, namespace: str, name: str, operations: Any) -> dict:
        return await self._kube.json_patch(kind, namespace, name, operations)

    async def patch_status(
        self, kind: str, namespace: str, name: str, status: Mapping[str, Any]
    ) -> dict[str, Any]:
        return await self._kube.patch_status(kind, namespace, name, status)

    async def delete(self, kind: str, namespace: str, name: str) -> bool:
        return await self._kube.delete(kind, namespace, name)
