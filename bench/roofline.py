"""A decode step's HBM roofline: the bytes one step must read, over the card's copy bandwidth.

Counted: the experts the step routes to (each distinct (layer, expert) once: w1, w3, w2),
every other weight a step reads (attention, norms, routers, shared experts, lm_head; not
the embedding table, of which a step reads one row per token), and the KV cache each
decoding request attends over. Not counted: activations, the KV written, sampling: small
beside the weights at these batches, so the bound stays a lower bound on the step time.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

HBM_BYTES_PER_S = 4.17e12  # measured on the H200 (device README: HBM copy)


@dataclass(frozen=True)
class Roofline:
    expert_bytes: int
    other_weight_bytes: int
    kv_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.expert_bytes + self.other_weight_bytes + self.kv_bytes

    @property
    def ms(self) -> float:
        return self.total_bytes / HBM_BYTES_PER_S * 1e3

    def to_dict(self) -> dict:
        return {**asdict(self), "total_bytes": self.total_bytes, "ms": self.ms}


def decode_roofline(engine, distinct_experts: int, contexts: list[int]) -> Roofline:
    """`distinct_experts`: (layer, expert) pairs the step routed to, summed over layers;
    `contexts`: each decoding request's tokens attended over."""
    shape = engine.geometry.shape
    config = engine.model_config
    embedding = 0 if config.tie_word_embeddings else config.vocab_size * config.hidden_size
    kv_per_token = shape.kv_page_bytes // shape.block_size  # one layer's K and V of one token
    return Roofline(
        expert_bytes=distinct_experts * 3 * shape.expert_page_bytes,
        other_weight_bytes=engine.plan.non_pool_weight_bytes - embedding * shape.dtype_bytes,
        kv_bytes=sum(contexts) * config.num_kv_layers * kv_per_token,
    )
