"""The escape hatch: engine flags and environment variables the spec has no field for,
added to the data-plane container as written (spec.dataPlane.extraArgs, extraEnv).

Flags go after the operator's, so for a flag given twice the spec's wins (argparse keeps
the last); an env var overrides the engine ConfigMap's of the same name (env beats
envFrom). The variables the operator sets itself cannot be replaced: the node id and the
writable cache directories the read-only root filesystem depends on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rimuru.operator.spec_error import SpecError

# Set by pods.dataplane_pod_template on every data-plane container.
OPERATOR_ENV = ("RIMURU_NODE_ID", "HOME", "TRITON_CACHE_DIR")


def parse_extra_args(dp: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(str(arg) for arg in dp.get("extraArgs") or ())


def parse_extra_env(dp: Mapping[str, Any], path: str) -> tuple[Mapping[str, Any], ...]:
    env = tuple(dict(var) for var in dp.get("extraEnv") or ())
    taken = sorted({var["name"] for var in env} & set(OPERATOR_ENV))
    if taken:
        raise SpecError(
            f"{path}.extraEnv",
            f"{', '.join(taken)}: set by the operator on every data-plane pod; choose another name",
        )
    return env
