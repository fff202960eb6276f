"""Which norms and RoPE the engine's model runs: fused kernels where the Triton kernels run,
unless `fused_layer_ops=False`; torch on the CPU path. (The tokens of the kernel path are
checked against the torch path in test_kernel_path.py.)"""

import pytest
import torch

from rimuru.dataplane.engine.engine import Engine
from rimuru.dataplane.engine.startup.config import EngineConfig
from rimuru.dataplane.model.ops import TorchOps, TritonOps

MiB = 2**20


@pytest.mark.parametrize(
    "use_kernels, fused, want",
    [(True, True, TritonOps), (True, False, TorchOps), (False, True, TorchOps)],
)
def test_engine_picks_its_layer_ops(use_kernels, fused, want):
    config = EngineConfig(
        activation_reserve=0, memory_budget=200 * MiB, use_kernels=use_kernels,
        fused_layer_ops=fused,
    )  # fmt: skip
    engine = Engine(config, log_plan=False)
    assert type(engine.model.ops) is want


def test_torch_qk_norm_rope_refuses_one_norm_weight_without_the_other():
    q, k = torch.ones(2, 4, 8), torch.ones(2, 2, 8)
    cos, sin = torch.ones(2, 8), torch.zeros(2, 8)
    with pytest.raises(ValueError, match="both weights or neither"):
        TorchOps().qk_norm_rope(q, k, cos, sin, torch.ones(8), None, 1e-6)
