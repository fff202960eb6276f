"""A step's small host vectors onto the device in one copy that does not stall the host."""

from __future__ import annotations

import numpy as np
import torch


class PinnedUpload:
    """One int32 vector per call onto the engine's device: written into a pinned buffer
    kept for the engine's life and copied asynchronously on CUDA; on the CPU, the vector
    itself (the same code path: the device is the host).

    The buffer is rewritten only once the previous copy out of it has run (an event
    recorded after it). Normally that copy finished long before: the engine waits for
    each step's sampled tokens before it builds the next step."""

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self._pinned: torch.Tensor | None = None
        self._copied: torch.cuda.Event | None = None

    def upload(self, host: np.ndarray) -> torch.Tensor:
        """`host` (1-D int32) on the device; on the CPU it shares `host`'s memory."""
        if host.dtype != np.int32 or host.ndim != 1:
            raise ValueError(f"upload takes a 1-D int32 array, got {host.dtype} {host.shape}")
        if self.device.type != "cuda":
            return torch.from_numpy(host)
        if self._copied is not None:
            self._copied.synchronize()
        if self._pinned is None or len(self._pinned) < len(host):
            size = max(len(host), 2 * (0 if self._pinned is None else len(self._pinned)), 4096)
            self._pinned = torch.empty(size, dtype=torch.int32, pin_memory=True)
        staged = self._pinned[: len(host)]
        staged.numpy()[:] = host
        on_device = staged.to(self.device, non_blocking=True)
        self._copied = torch.cuda.Event()
        self._copied.record(torch.cuda.current_stream(self.device))
        return on_device
