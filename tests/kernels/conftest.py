"""Run the Triton kernels on the CPU through Triton's interpreter (CI has no GPU).

TRITON_INTERPRET is read when ``@triton.jit`` decorates a function, so it must be set before
rimuru.kernels is imported. If another test folder imported it first, its kernels were built
for a GPU: re-import them here, helpers before the kernels that call them.
"""

import importlib
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

_DEPENDENCY_ORDER = [
    "rimuru.kernels.kv_pages",
    "rimuru.kernels.moe_configs",
    "rimuru.kernels.moe_align",
    "rimuru.kernels.moe_gemm",
    "rimuru.kernels.kv_write",
    "rimuru.kernels.paged_decode",
    "rimuru.kernels.paged_prefill",
    "rimuru.kernels.fused_moe",
    "rimuru.kernels",
]
for _name in _DEPENDENCY_ORDER:
    if _name in sys.modules:
        importlib.reload(sys.modules[_name])
