"""rimuru.policy is a leaf: both planes and the operator's slim image import it, so it
may pull in neither torch nor grpc (nor numpy or protobuf, which the base install of a
slim image need not have for it)."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torch", "numpy", "triton", "grpc", "google.protobuf")


def test_the_policy_leaf_imports_no_torch_and_no_grpc():
    probe = (
        "import json, sys\n"
        "import rimuru.policy, rimuru.policy.ranking, rimuru.policy.tunables\n"
        "rimuru.policy.Tunables(); rimuru.policy.HotnessRanking.uniform(2, 4).digest()\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []


def test_the_planes_share_one_type():
    # The data plane's engine and the control plane's store speak the very same classes.
    from rimuru.controlplane import store
    from rimuru.dataplane.engine.startup import config
    from rimuru.policy import Tunables

    assert config.Tunables is Tunables is store.Tunables


def test_the_root_package_serves_the_api_without_importing_the_engine_until_asked():
    # `import rimuru` happens in every pod (the CLI); the engine's torch only when used.
    probe = (
        "import json, sys\n"
        "import rimuru\n"
        f"before = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "from rimuru import Engine, EngineConfig, SamplingParams, Tunables, HotnessRanking\n"
        "from rimuru.dataplane.engine.engine import Engine as E\n"
        "print(json.dumps([before, Engine is E, 'torch' in sys.modules]))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [[], True, True]
    missing = subprocess.run(
        [sys.executable, "-c", "from rimuru import Engin"], capture_output=True, text=True
    )
    assert "cannot import name 'Engin' from 'rimuru'" in missing.stderr
