"""A step's small host tensors onto the device without stalling the host."""

from __future__ import annotations

import torch


def to_device(host: torch.Tensor, device) -> torch.Tensor:
    """A step's metadata onto the device without stalling the host: staged in pinned memory
    and copied asynchronously on CUDA (the caching host allocator keeps the staging buffer
    until the copy has run); the tensor itself on the CPU."""
    device = torch.device(device)
    if device.type != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)
