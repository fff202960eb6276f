"""The sampling parameters a benchmark request asks for, in-process or through gRPC alike."""

from __future__ import annotations

from rimuru.dataplane.engine.sched.request import SamplingParams


def bench_params(output_len: int, index: int, temperature: float) -> SamplingParams:
    """Exactly the trace's output length (`ignore_eos`, as vLLM's benchmark). Above
    temperature 0 each request is seeded by its index in the trace, so two policies (or two
    runs) sample the same streams and their outputs stay comparable."""
    return SamplingParams(
        max_tokens=output_len,
        ignore_eos=True,
        temperature=temperature,
        seed=index if temperature > 0 else None,
    )
