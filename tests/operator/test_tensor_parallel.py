"""spec.engine.tensorParallelSize: one GPU per rank in the pod's limits, the engine's flag,
and the shared memory the ranks use; a GPU count that disagrees is refused."""

from __future__ import annotations

import argparse
import copy

import kubernetes_validate
import pytest

from rimuru.operator.builders import build_dataplane_deployment, build_engine_config_map
from rimuru.operator.config import OperatorConfig
from rimuru.operator.spec import SpecError, parse_spec

CONFIG = OperatorConfig(dataplane_image="reg/dp:1", controlplane_image="reg/cp:1")


def _with_tp(rd, size, limits):
    rd = copy.deepcopy(rd)
    rd["spec"]["engine"]["tensorParallelSize"] = size
    rd["spec"]["dataPlane"]["resources"] = {"limits": limits}
    return rd


def test_ranks_set_the_gpu_limit_the_flag_and_shared_memory(gpu_rd, api, monkeypatch):
    rd = _with_tp(gpu_rd, 2, {"memory": "200Gi"})  # no GPU named: the operator asks for two
    spec = parse_spec(rd["metadata"], rd["spec"])
    deployment = build_dataplane_deployment(spec, CONFIG)
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["resources"]["limits"] == {"memory": "200Gi", "nvidia.com/gpu": 2}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    kubernetes_validate.validate(deployment, api.kube_version, strict=True)
    data = build_engine_config_map(spec)["data"]
    assert (data["RIMURU_TENSOR_PARALLEL_SIZE"], data["RIMURU_DEVICE"]) == ("2", "cuda")
    # the data plane's CLI reads it from the environment the ConfigMap becomes
    for key, value in data.items():
        monkeypatch.setenv(key, value)
    from rimuru.dataplane.serve import cli

    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    assert cli.engine_config(parser.parse_args([])).tensor_parallel_size == 2


def test_a_gpu_limit_that_disagrees_with_the_ranks_is_refused(gpu_rd):
    rd = _with_tp(gpu_rd, 4, {"nvidia.com/gpu": 2})
    with pytest.raises(SpecError) as info:
        parse_spec(rd["metadata"], rd["spec"])
    assert info.value.field == "spec.engine.tensorParallelSize"
    assert "needs one GPU per rank (4)" in str(info.value) and "ask for 2" in str(info.value)
    agreeing = _with_tp(gpu_rd, 2, {"nvidia.com/gpu": 2})
    assert parse_spec(agreeing["metadata"], agreeing["spec"]).engine.tensor_parallel_size == 2


def test_one_rank_leaves_the_pod_and_the_flags_alone(gpu_rd):
    spec = parse_spec(gpu_rd["metadata"], gpu_rd["spec"])
    assert spec.engine.tensor_parallel_size == 1
    assert "RIMURU_TENSOR_PARALLEL_SIZE" not in build_engine_config_map(spec)["data"]


@pytest.mark.parametrize("size", [0, 9, 2.5])
def test_the_parser_refuses_sizes_outside_one_to_eight(gpu_rd, size):
    rd = _with_tp(gpu_rd, size, {})
    with pytest.raises(SpecError) as info:
        parse_spec(rd["metadata"], rd["spec"])
    assert info.value.field == "spec.engine.tensorParallelSize"
