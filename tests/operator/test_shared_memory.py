"""A data-plane pod with several GPUs gets a memory-backed /dev/shm (tensor parallel's
NCCL and worker processes share memory there; a container's own is 64 MiB); a pod with
one GPU or none does not."""

from __future__ import annotations

import copy

import kubernetes_validate
import pytest

from rimuru.operator.builders import build_dataplane_deployment
from rimuru.operator.config import OperatorConfig
from rimuru.operator.spec import parse_spec

CONFIG = OperatorConfig(dataplane_image="reg/dp:1", controlplane_image="reg/cp:1")


@pytest.mark.parametrize("num_gpus,shm", [(0, False), (1, False), (2, True), (8, True)])
def test_several_gpus_get_a_shared_memory_volume(gpu_rd, api, num_gpus, shm):
    rd = copy.deepcopy(gpu_rd)
    limits = rd["spec"]["dataPlane"]["resources"]["limits"]
    limits["nvidia.com/gpu"] = num_gpus
    if num_gpus > 1:
        rd["spec"]["engine"]["tensorParallelSize"] = num_gpus  # one rank per GPU
    if num_gpus == 0:
        del rd["spec"]["engine"]["gpuMemoryUtilization"]
        rd["spec"]["engine"]["memoryBudget"] = "8Gi"
    deployment = build_dataplane_deployment(parse_spec(rd["metadata"], rd["spec"]), CONFIG)
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    volume = {"name": "dshm", "emptyDir": {"medium": "Memory"}}
    mount = {"name": "dshm", "mountPath": "/dev/shm"}
    assert (volume in pod["volumes"], mount in container["volumeMounts"]) == (shm, shm)
    kubernetes_validate.validate(deployment, api.kube_version, strict=True)
