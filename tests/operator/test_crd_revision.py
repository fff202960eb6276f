"""The operator refuses to start on an older RimuruDeployment CRD than it needs (Helm does
not upgrade crds/), saying how to upgrade it, and the CRD's revision, the operator's and
the chart's version move together with the schema."""

from __future__ import annotations

import copy
import hashlib
import json

import pytest
import yaml

from rimuru.operator.crd import CRD_REVISION, CRD_REVISION_ANNOTATION, crd_problem
from tests.operator import operator_harness as harness
from tests.operator.conftest import CHART, load_crd

# revision -> (sha256 of the CRD's spec, the chart version that first shipped it). A CRD
# change fails this test until the revision is raised (here, in the CRD's annotation and in
# operator/crd.py) and the chart's version with it.
REVISIONS = {2: ("db428cec", "0.2.0"), 3: ("f03d7ed9", "0.3.0")}
CRDS = "apiextensions.k8s.io/v1/customresourcedefinitions"


def _spec_digest(crd: dict) -> str:
    canonical = json.dumps(crd["spec"], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:8]


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def test_the_crd_the_operator_and_the_chart_agree_on_the_revision():
    crd = load_crd()
    assert crd["metadata"]["annotations"][CRD_REVISION_ANNOTATION] == str(CRD_REVISION)
    digest, first_chart_version = REVISIONS[CRD_REVISION]
    assert _spec_digest(crd) == digest, (
        "the CRD changed: raise its rimuru.dev/crd-revision and operator/crd.py CRD_REVISION, "
        "bump Chart.yaml's version, and record both here"
    )
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert _version(chart["version"]) >= _version(first_chart_version)


def test_which_crds_are_refused():
    current = load_crd()
    assert crd_problem(current) is None
    newer = copy.deepcopy(current)
    newer["metadata"]["annotations"][CRD_REVISION_ANNOTATION] = str(CRD_REVISION + 1)
    assert crd_problem(newer) is None
    previous = copy.deepcopy(current)
    del previous["metadata"]["annotations"]  # the first chart's CRD had none
    message = crd_problem(previous)
    assert f"is revision 1; this operator needs revision {CRD_REVISION}" in message
    assert "helm show crds rimuru-operator --version <chart version>" in message
    assert "not installed" in crd_problem(None)


async def test_an_older_crd_is_refused_at_start_with_the_upgrade_message(kmock, env, tiny_rd):
    http = env
    old = load_crd()
    del old["metadata"]["annotations"]
    kmock.objects[CRDS, None, old["metadata"]["name"]] = old
    await harness.create_tiny(http, tiny_rd)
    with pytest.raises(Exception) as stopped:  # kopf's: a startup handler failed for good
        async with harness.operator_running() as runner:
            await harness.eventually(lambda: runner.future.done(), what="the operator exits")
    refusal = str(stopped.value.__cause__)
    assert f"is revision 1; this operator needs revision {CRD_REVISION}" in refusal
    assert "helm show crds" in refusal
    # Nothing was written for the RimuruDeployment it could not serve.
    assert harness.obj(kmock, harness.DEPLOYMENTS, "tiny-dataplane") is None
    assert "status" not in harness.obj(kmock, harness.RD, "tiny")


async def test_a_refused_status_write_says_how_to_upgrade(kmock, env, tiny_rd, caplog):
    """A CRD changed under a running operator: the periodic status write is refused (422)
    and the log says what to do, not only that it failed."""
    http = env
    refused = 'RimuruDeployment.rimuru.dev "tiny" is invalid: status.endpoints: field not declared'

    def hint_logged() -> bool:
        return any(
            r.levelname == "ERROR"
            and refused in r.getMessage()
            and "helm show crds" in r.getMessage()
            for r in list(caplog.records)
        )

    async with harness.operator_running() as runner:
        await harness.create_tiny(http, tiny_rd)
        await harness.eventually(
            lambda: harness.obj(kmock, harness.DEPLOYMENTS, "tiny-dataplane"), what="children"
        )
        await harness.emulate_rollout(http, "tiny-controlplane", 1)
        await harness.eventually(
            lambda: harness.obj(kmock, harness.RD, "tiny")["status"]["policy"]["desiredVersion"],
            what="policy pushed",
        )
        kmock.invalid_status = refused
        await harness.emulate_rollout(http, "tiny-dataplane", 1)  # a status to write
        await harness.eventually(hint_logged, what="the upgrade hint logged")
        kmock.invalid_status = None
        await harness.deleted(kmock, http)
    assert runner.exception is None
