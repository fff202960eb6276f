"""Suite-wide settings."""

import os
import shutil
import subprocess

# CI has no GPU: every Triton kernel in this process runs under the interpreter. Set before
# anything imports triton (tests/kernels/conftest.py refuses a session where it was not).
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

# Tiny CPU models gain nothing from intra-op threads, and on a shared 2-core machine
# oversubscribed threads make them tens of times slower.
torch.set_num_threads(1)


@pytest.fixture
def self_signed(tmp_path):
    """(cert.pem, key.pem) of a self-signed certificate for localhost (TLS tests)."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1",
         "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
         "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key
