"""Suite-wide settings."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

# CI has no GPU: every Triton kernel in this process runs under the interpreter. Set before
# anything imports triton (tests/kernels/conftest.py refuses a session where it was not).
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

# The repository root is first on sys.path here (`python -m pytest` puts the working directory
# there, pytest-xdist's workers put it on sys.path and PYTHONPATH), where its folders would
# shadow installed packages of the same name: kernels/ hides Hugging Face's `kernels`, which
# transformers imports, as operator/ could the standard library's. The project is imported by
# its installed names (rimuru.*); from the root only `tests.*` is needed, which nothing
# installed provides. So the root goes last, behind every installed package, before the tests
# import anything; subprocesses get it only as their own working directory.
_ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or os.curdir).resolve() != _ROOT] + [str(_ROOT)]
os.environ["PYTHONPATH"] = os.pathsep.join(
    p
    for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if p and Path(p).resolve() != _ROOT
)

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


# Tiny hybrid checkpoints (Qwen3-Next with a dense layer, Qwen3.5-MoE with tied embeddings),
# built by transformers: the model parity tests and the engine's hybrid tests compare to them.
_HYBRID_SHAPES = dict(
    vocab_size=512,
    hidden_size=64,
    num_hidden_layers=4,
    full_attention_interval=2,  # layers 1 and 3 attend, 0 and 2 are Gated DeltaNet
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,  # rotary 8 of 32 (partial_rotary_factor 0.25)
    linear_num_key_heads=2,
    linear_num_value_heads=4,  # 2 value heads per key head
    linear_key_head_dim=16,
    linear_value_head_dim=8,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=48,
    num_experts=8,
    num_experts_per_tok=2,
    initializer_range=0.15,
    eos_token_id=None,
)


def _randomise_init_constants(model) -> None:
    """Zero-initialised norms (scale 1 + 0), ones gated norms, ones dt_bias would let a wrong
    (1 + w) or a dropped bias pass: give them random values, as a trained model has."""
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("norm.weight", "layernorm.weight", "dt_bias")):
                param.add_(torch.randn(param.shape, generator=gen) * 0.3)


@pytest.fixture(scope="session")
def hybrid_checkpoints(tmp_path_factory):
    """{family: (transformers model, checkpoint directory)} for qwen3_next and qwen3_5_moe."""
    import transformers

    torch.manual_seed(1234)
    shapes = _HYBRID_SHAPES
    nxt = transformers.Qwen3NextConfig(**shapes, intermediate_size=96, mlp_only_layers=[2])
    q35 = transformers.Qwen3_5MoeTextConfig(**shapes, tie_word_embeddings=True)
    models = {
        "qwen3_next": transformers.Qwen3NextForCausalLM(nxt),
        "qwen3_5_moe": transformers.Qwen3_5MoeForCausalLM(q35),
    }
    out = {}
    for family, model in models.items():
        _randomise_init_constants(model)
        model.eval()
        path = tmp_path_factory.mktemp(family)
        model.save_pretrained(path)
        out[family] = (model, path)
    return out
