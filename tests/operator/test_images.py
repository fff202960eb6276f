"""The images' Dockerfiles agree with pyproject's extras, and the slim ones really need
no torch: their entry points import with torch (and numpy) made unimportable.

(No Docker engine here: the images themselves are not built by the tests.)"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
IMAGES = REPO / "helm" / "images"
EXTRAS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def installed_extras(dockerfile: str) -> set[str]:
    text = (IMAGES / dockerfile).read_text()
    (extras,) = set(re.findall(r'"rimuru\[([a-z,]+)\]"', text))
    return set(extras.split(","))


@pytest.mark.parametrize(
    "dockerfile,extras,heavy",
    [
        ("dataplane.Dockerfile", {"engine", "kernels", "serve"}, True),
        ("controlplane.Dockerfile", {"controlplane"}, False),
        ("operator.Dockerfile", {"operator"}, False),
    ],
)
def test_dockerfile_installs_the_right_extras(dockerfile, extras, heavy):
    assert installed_extras(dockerfile) == extras
    requirements = [req for extra in extras for req in EXTRAS[extra]]
    assert any(req.startswith("torch") for req in requirements) is heavy
    text = (IMAGES / dockerfile).read_text()
    assert "USER 10001:10001" in text  # the pods' runAsUser
    assert 'ENTRYPOINT ["rimuru"]' in text


@pytest.mark.parametrize("dockerfile", sorted(p.name for p in IMAGES.glob("*.Dockerfile")))
def test_dockerfile_copies_every_package_folder(dockerfile):
    # The wheel is built from the copied tree: a folder left out is a package missing
    # from the image, found only when a pod imports it.
    package_dir = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"
    ]
    copied = set(re.findall(r"^COPY (\S+) \1$", (IMAGES / dockerfile).read_text(), re.M))
    needed = {folder.split("/")[0] for folder in package_dir.values()}
    assert needed <= copied, needed - copied


@pytest.mark.parametrize(
    "module", ["rimuru.operator.handlers", "rimuru.operator.cli", "rimuru.controlplane.cli"]
)
def test_slim_entry_points_import_without_torch(module):
    blocker = (
        "import sys\n"
        "for name in ('torch', 'numpy', 'triton'):\n"
        "    sys.modules[name] = None  # any import of them raises ImportError\n"
        f"import {module}\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", blocker], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
