"""Rimuru: serve MoE LLMs on memory-limited GPUs.

Expert weights and the paged KV cache share one pool of GPU pages; an adjuster
moves the boundary between them after every scheduling round.

The Python API, importable from here:

    from rimuru import Engine, EngineConfig, SamplingParams, Tunables

Subpackages (dependencies point one way):
    rimuru.operator     -> rimuru.controlplane (client) -> rimuru.v1 (protos)
    rimuru.dataplane    -> rimuru.kernels, rimuru.v1
    rimuru.policy       the policy vocabulary both planes share (stdlib only)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

# Resolved on first use, so that `import rimuru` (every pod, the operator's image without
# torch) does not import the engine.
_API = {
    "Engine": "rimuru.dataplane.engine.engine",
    "EngineConfig": "rimuru.dataplane.engine.startup.config",
    "SamplingParams": "rimuru.dataplane.engine.sched.request",
    "Tunables": "rimuru.policy",
    "HotnessRanking": "rimuru.policy",
}
__all__ = ["Engine", "EngineConfig", "HotnessRanking", "SamplingParams", "Tunables"]

if TYPE_CHECKING:
    from rimuru.dataplane.engine.engine import Engine
    from rimuru.dataplane.engine.sched.request import SamplingParams
    from rimuru.dataplane.engine.startup.config import EngineConfig
    from rimuru.policy import HotnessRanking, Tunables


def __getattr__(name: str):
    if name not in _API:
        raise AttributeError(f"module 'rimuru' has no attribute {name!r}")
    return getattr(importlib.import_module(_API[name]), name)
