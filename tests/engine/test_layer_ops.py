"""Which norms and RoPE the engine's model runs: fused kernels where the Triton kernels run,
unless `fused_layer_ops=False`; torch on the CPU path. (The tokens of the kernel path are
checked against the torch path in test_kernel_path.py.)"""

import pytest

from rimuru.dataplane.engine.config import EngineConfig
from rimuru.dataplane.engine.engine import Engine
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
