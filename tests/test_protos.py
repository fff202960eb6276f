"""The committed stubs are what protos/generate.py makes from the .proto files, and import."""

from __future__ import annotations

import importlib
import importlib.metadata
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STUB_DIR = ROOT / "protos" / "rimuru" / "v1"


def test_committed_stubs_match_a_fresh_generation(tmp_path):
    pytest.importorskip("grpc_tools")
    subprocess.run(
        [sys.executable, str(ROOT / "protos" / "generate.py"), "--out", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    fresh_dir = tmp_path / "rimuru" / "v1"
    fresh = sorted(p.name for p in fresh_dir.iterdir())
    committed = sorted(p.name for p in STUB_DIR.glob("*_pb2*"))
    assert fresh == committed
    stale = [n for n in fresh if (fresh_dir / n).read_bytes() != (STUB_DIR / n).read_bytes()]
    assert not stale, f"stale stubs {stale}: run `python protos/generate.py` and commit them"


def test_grpcio_tools_is_the_pinned_one():
    """The stubs depend on the generator's version; pyproject pins it (see generate.py)."""
    test_extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]["test"]
    (pin,) = [r for r in test_extra if r.startswith("grpcio-tools")]
    assert pin.split(",")[0].split("#")[0].strip() == (
        f"grpcio-tools=={importlib.metadata.version('grpcio-tools')}"
    )


@pytest.mark.parametrize(
    ("module", "services"),
    [
        ("rimuru.v1.inference_pb2", {"Inference"}),
        ("rimuru.v1.control_pb2", {"PolicyService", "PolicyDiscoveryService"}),
    ],
)
def test_stubs_import_and_declare_the_services(module, services):
    pb2 = importlib.import_module(module)
    importlib.import_module(module + "_grpc")
    assert set(pb2.DESCRIPTOR.services_by_name) == services
    assert pb2.DESCRIPTOR.package == "rimuru.v1"


def test_messages_round_trip():
    from rimuru.v1 import control_pb2, inference_pb2

    request = inference_pb2.GenerateRequest(
        token_ids=inference_pb2.TokenIds(ids=[1, 2, 3]),
        sampling=inference_pb2.SamplingParams(temperature=0.0, seed=7, stop_token_ids=[2]),
    )
    again = inference_pb2.GenerateRequest.FromString(request.SerializeToString())
    assert again.WhichOneof("input") == "token_ids" and list(again.token_ids.ids) == [1, 2, 3]
    assert again.sampling.HasField("temperature") and not again.sampling.HasField("top_p")
    update = control_pb2.PolicyUpdate(version=3, nonce="n", policy=control_pb2.Policy(version=3))
    assert control_pb2.PolicyUpdate.FromString(update.SerializeToString()) == update
