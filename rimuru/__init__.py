"""Rimuru: serve MoE LLMs on memory-limited GPUs.

Expert weights and the paged KV cache share one pool of GPU pages; an adjuster
moves the boundary between them after every scheduling round.

Subpackages (dependencies point one way):
    rimuru.operator     -> rimuru.controlplane (client) -> rimuru.v1 (protos)
    rimuru.dataplane    -> rimuru.kernels, rimuru.v1
"""

__version__ = "0.1.0"
