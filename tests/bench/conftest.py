"""Fixtures for the benchmark tests: the trace derivation script, imported by path."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "derive_sharegpt_trace.py"


@pytest.fixture(scope="session")
def derive() -> ModuleType:
    spec = importlib.util.spec_from_file_location("derive_sharegpt_trace", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    # Registered first: dataclasses resolve string annotations through sys.modules.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
