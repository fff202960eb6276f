"""Run the Triton kernels on the CPU through Triton's interpreter (CI has no GPU).

TRITON_INTERPRET is read when ``@triton.jit`` decorates a function, triton's own library
functions (tl.max, tl.cdiv, ...) included, so it must be set before triton is imported.
Triton cannot be re-imported safely, so a session in which an earlier test folder imported
it without the interpreter stops here with a message instead of failing obscurely.
"""

import os
import sys

import pytest

os.environ["TRITON_INTERPRET"] = "1"

if "triton.language" in sys.modules:
    from triton.runtime.interpreter import InterpretedFunction

    if not isinstance(sys.modules["triton.language"].cdiv, InterpretedFunction):
        raise pytest.UsageError(
            "triton was imported before tests/kernels/conftest.py could set TRITON_INTERPRET=1; "
            "run `TRITON_INTERPRET=1 pytest ...` or run tests/kernels in its own pytest process"
        )
