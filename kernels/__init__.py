"""rimuru.kernels: Triton kernels of the data plane, each beside its launcher and torch reference.

Imports only torch and triton. Launchers (signatures in each module's docstring):

- fused_moe.py: fused_moe_paged (experts read from pool pages or loading-buffer slots),
  fused_moe_contiguous (its twin over [E, 2I, D] / [E, D, I] stacks), torch references.
- moe_align.py: moe_align_block_size, the sort-by-expert step both use.
- moe_configs.py: tuned block configurations (configs/*.json), get_moe_config.
- moe_gemm.py / moe_sum.py: the fused MoE's two grouped GEMMs and its top-k sum.
- expert_copy.py: copy_routed_experts (routed, offloaded experts from pinned host memory into
  loading-buffer slots, decided on the device), torch reference.
- router_topk.py: router_topk (softmax, top-k and renormalisation of router logits).
- routing_histogram.py: routing_histogram (tokens per expert, added to a running total).
- exponential_race.py: exponential_race (one token per row, greedy or drawn by the Gumbel-max
  trick from Philox noise keyed per row: a batch's sampling in one launch).
- kv_write.py: write_kv_pages (slot mapping into the paged KV view).
- gated_delta_decode.py: gated_delta_decode (Gated DeltaNet's decode step, each sequence's
  recurrent state in its page of the pool), torch reference.
- causal_conv_states.py: causal_conv_decode / causal_conv_prefill (Gated DeltaNet's short
  convolution, each sequence's state in its page of the pool), torch references.
- rms_norm.py: rms_norm, optionally fused with the residual add before it.
- rope.py: qk_norm_rope (RoPE of q and k in one launch, after Qwen3's per-head norms).
- paged_decode.py / paged_prefill.py: paged attention over block tables (GQA).
- moe_bench.py: model shapes, expert fixtures and timers of the MoE tuner and kernel table
  (bench/tune_moe.py, bench/kernels_gpu.py); not imported here, nor by the engine.
"""

from rimuru.kernels.causal_conv_states import (
    causal_conv_decode,
    causal_conv_decode_reference,
    causal_conv_prefill,
    causal_conv_prefill_reference,
)
from rimuru.kernels.expert_copy import copy_routed_experts, copy_routed_experts_reference
from rimuru.kernels.exponential_race import exponential_race
from rimuru.kernels.fused_moe import (
    fused_moe_contiguous,
    fused_moe_paged,
    fused_moe_paged_reference,
    fused_moe_reference,
    fused_moe_variant,
)
from rimuru.kernels.gated_delta_decode import gated_delta_decode, gated_delta_decode_reference
from rimuru.kernels.kv_write import write_kv_pages, write_kv_pages_reference
from rimuru.kernels.moe_align import MoeAlignment, moe_align_block_size
from rimuru.kernels.moe_configs import GemmTile, MoeConfig, get_moe_config
from rimuru.kernels.paged_decode import (
    decode_warmup_contexts,
    paged_decode_attention,
    paged_decode_attention_reference,
)
from rimuru.kernels.paged_prefill import paged_prefill_attention, paged_prefill_attention_reference
from rimuru.kernels.rms_norm import rms_norm, rms_norm_reference
from rimuru.kernels.rope import qk_norm_rope, qk_norm_rope_reference
from rimuru.kernels.router_topk import router_topk
from rimuru.kernels.routing_histogram import routing_histogram

# The engine's name for the paged launcher (dataplane/engine/engine.py imports it).
paged_fused_moe = fused_moe_paged

__all__ = [
    "GemmTile",
    "MoeAlignment",
    "MoeConfig",
    "causal_conv_decode",
    "causal_conv_decode_reference",
    "causal_conv_prefill",
    "causal_conv_prefill_reference",
    "copy_routed_experts",
    "copy_routed_experts_reference",
    "decode_warmup_contexts",
    "exponential_race",
    "fused_moe_contiguous",
    "fused_moe_paged",
    "fused_moe_paged_reference",
    "fused_moe_reference",
    "fused_moe_variant",
    "gated_delta_decode",
    "gated_delta_decode_reference",
    "get_moe_config",
    "moe_align_block_size",
    "paged_decode_attention",
    "paged_decode_attention_reference",
    "paged_fused_moe",
    "paged_prefill_attention",
    "paged_prefill_attention_reference",
    "qk_norm_rope",
    "qk_norm_rope_reference",
    "rms_norm",
    "rms_norm_reference",
    "router_topk",
    "routing_histogram",
    "write_kv_pages",
    "write_kv_pages_reference",
]
