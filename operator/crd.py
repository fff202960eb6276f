"""The RimuruDeployment CRD this operator needs, checked once at start.

Helm installs a chart's `crds/` on first install only: after `helm upgrade` the cluster
may still hold the previous CRD, whose schema prunes or refuses (HTTP 422) the status
fields this operator writes, so status would stay empty with nothing but retries in the
log. The CRD carries its revision in an annotation; an operator that finds an older one
refuses to start and says how to upgrade it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rimuru.operator.spec import GROUP, PLURAL

CRD_NAME = f"{PLURAL}.{GROUP}"
CRD_REVISION_ANNOTATION = f"{GROUP}/crd-revision"
# What must stay true: raised with every change of the CRD's schema, in step with the
# annotation in helm/rimuru-operator/crds/ and with a new chart version (the tests hold
# all three to the schema). The first CRD carried no annotation: revision 1.
CRD_REVISION = 3
UPGRADE_HINT = (
    "helm upgrade does not update CRDs: apply this chart version's CRD first, "
    "`helm show crds rimuru-operator --version <chart version> | "
    "kubectl apply --server-side -f -` (or kubectl apply --server-side -f "
    "helm/rimuru-operator/crds/ from the chart's source), then restart the operator"
)


def installed_revision(crd: Mapping[str, Any]) -> int:
    annotations = crd.get("metadata", {}).get("annotations") or {}
    value = str(annotations.get(CRD_REVISION_ANNOTATION, "1"))
    return int(value) if value.isdigit() else 0


def crd_problem(crd: Mapping[str, Any] | None) -> str | None:
    """Why this operator cannot serve the cluster's CRD (None = it can). A newer CRD is
    accepted: its changes add to the schema, and this operator writes what it knows."""
    if crd is None:
        return f"the RimuruDeployment CRD ({CRD_NAME}) is not installed; {UPGRADE_HINT}"
    revision = installed_revision(crd)
    if revision < CRD_REVISION:
        return (
            f"the installed RimuruDeployment CRD ({CRD_NAME}) is revision {revision}; this "
            f"operator needs revision {CRD_REVISION} or later (status writes would be "
            f"refused with HTTP 422): {UPGRADE_HINT}"
        )
    return None
