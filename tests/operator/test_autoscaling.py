"""spec.autoscaling becomes an HPA on the RimuruDeployment's scale subresource, driven by
the data-plane pods' waiting requests; the schema keeps its bounds; removing it deletes
the HPA (against the emulated API server)."""

from __future__ import annotations

import copy

import kubernetes_validate
import pytest
from kubernetes_asyncio.client import Configuration

from rimuru.operator import reconcile
from rimuru.operator.builders import Tokens, build_children
from rimuru.operator.config import OperatorConfig
from rimuru.operator.kube import KubeClient
from rimuru.operator.spec import parse_spec

CONFIG = OperatorConfig(dataplane_image="reg/dp:1", controlplane_image="reg/cp:1")
TOKENS = Tokens(operator="op-t0k3n", dataplane="dp-t0k3n")


def _autoscaled(rd, api, **scaling):
    rd = copy.deepcopy(rd)
    rd["spec"]["autoscaling"] = scaling
    rd, errors = api.admit(rd)
    assert errors == []
    return parse_spec(rd["metadata"], rd["spec"])


def _autoscalers(spec):
    return [c for c in build_children(spec, CONFIG) if c["kind"] == "HorizontalPodAutoscaler"]


def test_autoscaling_is_an_hpa_on_the_scale_subresource(tiny_rd, api):
    assert _autoscalers(parse_spec(tiny_rd["metadata"], tiny_rd["spec"])) == []
    (hpa,) = _autoscalers(_autoscaled(tiny_rd, api, maxReplicas=4))
    assert hpa["metadata"]["name"] == "tiny-dataplane"
    assert hpa["metadata"]["ownerReferences"][0]["uid"] == "uid-tiny-1"
    assert hpa["spec"] == {
        "scaleTargetRef": {
            "apiVersion": "rimuru.dev/v1alpha1",
            "kind": "RimuruDeployment",
            "name": "tiny",
        },
        "minReplicas": 1,
        "maxReplicas": 4,
        "metrics": [
            {
                "type": "Pods",
                "pods": {
                    "metric": {"name": "rimuru_num_requests_waiting"},
                    "target": {"type": "AverageValue", "averageValue": "4"},
                },
            }
        ],
    }
    kubernetes_validate.validate(hpa, api.kube_version, strict=True)
    (hpa,) = _autoscalers(
        _autoscaled(
            tiny_rd, api, minReplicas=2, maxReplicas=8, targetWaitingRequests=16,
            metricName="rimuru_waiting_avg",
        )
    )  # fmt: skip
    pods = hpa["spec"]["metrics"][0]["pods"]
    assert (hpa["spec"]["minReplicas"], pods["metric"]["name"]) == (2, "rimuru_waiting_avg")
    assert pods["target"]["averageValue"] == "16"


@pytest.mark.parametrize(
    "scaling,message",
    [
        ({"minReplicas": 5, "maxReplicas": 2}, "must not exceed"),
        ({"minReplicas": 2}, "maxReplicas"),
        ({"maxReplicas": 2, "targetWaitingRequests": 0}, "targetWaitingRequests"),
        ({"maxReplicas": 2, "metricName": "not a name"}, "metricName"),
    ],
)
def test_the_schema_refuses_autoscaling_that_cannot_work(tiny_rd, api, scaling, message):
    rd = copy.deepcopy(tiny_rd)
    rd["spec"]["autoscaling"] = scaling
    _, errors = api.admit(rd)
    assert errors and message in " ".join(errors)


async def test_removing_autoscaling_deletes_the_hpa(kmock, tiny_rd, api):
    kmock.resources["autoscaling/v2/horizontalpodautoscalers"] = kmock.ResourceInfo(
        kind="HorizontalPodAutoscaler", namespaced=True
    )
    kube = KubeClient(Configuration(host=str(kmock.url).rstrip("/")))
    try:
        on = _autoscaled(tiny_rd, api, maxReplicas=3)
        await reconcile.apply_children(kube, on, CONFIG, TOKENS)
        assert await kube.get("HorizontalPodAutoscaler", "default", "tiny-dataplane")
        off = parse_spec(tiny_rd["metadata"], tiny_rd["spec"])
        await reconcile.apply_children(kube, off, CONFIG, TOKENS)
        await reconcile.prune_children(kube, off, CONFIG)
        assert await kube.get("HorizontalPodAutoscaler", "default", "tiny-dataplane") is None
    finally:
        await kube.close()
