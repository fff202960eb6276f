"""Layout and packaging: one import root, stdlib `operator` untouched, lint clean."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STDLIB_OPERATOR = "import operator, sys; assert operator.__file__.endswith('operator.py') and 'site-packages' not in operator.__file__ and operator.add(2, 3) == 5; print(operator.__file__)"


@pytest.mark.parametrize(
    "argv",
    [
        [sys.executable, "-c", STDLIB_OPERATOR],
        [sys.executable, "-m", "rimuru", "--help"],
        [sys.executable, "-i", "-c", STDLIB_OPERATOR],
    ],
    ids=["python -c", "python -m", "repl"],
)
def test_stdlib_operator_wins_in_the_repo_root(argv):
    # run from the repo root, where a folder named operator/ sits on sys.path[0]
    result = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, input="", timeout=120)
    assert result.returncode in (0, 2), result.stderr
    if "-m" not in argv:
        assert str(ROOT / "operator") not in result.stdout


def test_installed_packages_win_over_the_repo_root_in_the_suite():
    # tests/conftest.py puts the root behind site-packages, so that kernels/ does not hide
    # Hugging Face's `kernels` (transformers >= 5.25 imports it) nor operator/ the stdlib's
    import importlib.metadata
    import importlib.util
    import site

    behind = [sys.path.index(p) for p in site.getsitepackages() if p in sys.path]
    assert behind and sys.path.index(str(ROOT)) > max(behind)
    names = ["operator"]
    try:
        importlib.metadata.distribution("kernels")
        names.append("kernels")
    except importlib.metadata.PackageNotFoundError:
        pass
    for name in names:
        # (not the checkout's folder of that name; a venv may live inside the checkout)
        assert not Path(importlib.util.find_spec(name).origin).is_relative_to(ROOT / name), name


def test_subpackages_import_under_one_root():
    import rimuru.controlplane
    import rimuru.dataplane
    import rimuru.kernels
    import rimuru.operator
    import rimuru.v1

    assert Path(rimuru.dataplane.__file__).parent == ROOT / "dataplane"
    assert Path(rimuru.operator.__file__).parent == ROOT / "operator"
    import rimuru

    for package, folder in (
        (rimuru, "rimuru"),
        (rimuru.v1, "protos/rimuru/v1"),
        (rimuru.controlplane, "controlplane"),
        (rimuru.kernels, "kernels"),
    ):
        assert Path(package.__file__).parent == ROOT / folder


def test_every_package_folder_is_listed_in_pyproject():
    import tomllib

    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    roots = {
        "dataplane": "rimuru.dataplane",
        "controlplane": "rimuru.controlplane",
        "kernels": "rimuru.kernels",
        "operator": "rimuru.operator",
        "rimuru": "rimuru",
        "protos/rimuru/v1": "rimuru.v1",
    }
    found = set()
    for folder, package in roots.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([package, *rel.parts]))
    assert found == listed


def test_plain_wheel_contains_every_subpackage(tmp_path):
    # setuptools builds in the checkout's build/, which it never prunes: left behind, it would
    # put modules deleted since into the next wheel (and litter the tree)
    build = ROOT / "build"
    had_build = build.exists()
    try:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--no-deps",
                "--no-build-isolation",
                "-w",
                str(tmp_path),
                str(ROOT),
            ],
            check=True,
            capture_output=True,
            timeout=300,
        )
    finally:
        if not had_build:
            shutil.rmtree(build, ignore_errors=True)
    (wheel,) = tmp_path.glob("rimuru-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for module in (
        "rimuru/cli.py",
        "rimuru/__main__.py",
        "rimuru/v1/control_pb2.py",
        "rimuru/policy/tunables.py",
        "rimuru/v1/inference_pb2_grpc.py",
        "rimuru/v1/control.proto",
        "rimuru/dataplane/memory/allocator.py",
        "rimuru/kernels/__init__.py",
        "rimuru/operator/__init__.py",
        "rimuru/controlplane/__init__.py",
        "rimuru/dataplane/data/sharegpt_qwen_cpu.npz",
    ):
        assert module in names, module
    assert not any(n.startswith(("operator/", "protos/")) for n in names)


def test_ruff_lint_and_format_clean():
    check = subprocess.run(
        [sys.executable, "-m", "ruff", "check", str(ROOT)], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout
    fmt = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", str(ROOT)],
        capture_output=True,
        text=True,
    )
    assert fmt.returncode == 0, fmt.stdout
