"""Suite-wide settings."""

import os

# CI has no GPU: every Triton kernel in this process runs under the interpreter. Set before
# anything imports triton (tests/kernels/conftest.py refuses a session where it was not).
os.environ.setdefault("TRITON_INTERPRET", "1")

import torch

# Tiny CPU models gain nothing from intra-op threads, and on a shared 2-core machine
# oversubscribed threads make them tens of times slower.
torch.set_num_threads(1)
