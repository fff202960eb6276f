"""Kubernetes quantities and GPU resources, as a RimuruDeployment's spec reads them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rimuru.operator.spec_error import SpecError
from rimuru.sizes import size_value

# Extended resources that hand the container GPUs the engine reaches as torch's "cuda"
# device (ROCm builds of torch name AMD GPUs so too): whole GPUs, or NVIDIA MIG slices
# (nvidia.com/mig-1g.10gb, ...). The CRD's CEL rule on gpuMemoryUtilization names the same.
GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu")
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"


def quantity_bytes(quantity: int | str, field: str) -> int:
    """A Kubernetes byte quantity ("60Gi", "1.5G", 1024) as whole bytes."""
    value = size_value(quantity, kubernetes=True)
    if value is None:
        raise SpecError(field, f"{quantity!r} is not a byte quantity such as 60Gi or 64G")
    if value != value.to_integral_value() or value <= 0:
        raise SpecError(field, f"{quantity!r} must be a positive whole number of bytes")
    return int(value)


def is_gpu_resource(name: str) -> bool:
    return name in GPU_RESOURCES or name.startswith(MIG_RESOURCE_PREFIX)


def count_gpus(limits: Mapping[str, Any], path: str) -> int:
    """GPUs (whole or MIG slices) a container's limits ask for, all of one resource;
    extended resources are whole numbers, and `nvidia.com/gpu: 0` asks for none."""
    counts = {}
    for name, value in limits.items():
        if not is_gpu_resource(name):
            continue
        text = str(value)
        if isinstance(value, bool) or not text.isdigit():
            raise SpecError(f"{path}['{name}']", f"must be a whole number of GPUs; got {value!r}")
        if int(text) > 0:
            counts[name] = int(text)
    if len(counts) > 1:
        # One engine, one kind of device: the GPUs of the other kinds would sit idle.
        raise SpecError(
            path,
            f"mix GPU resources ({', '.join(sorted(counts))}): a data plane runs on one "
            "kind of GPU; ask for one",
        )
    return sum(counts.values())
