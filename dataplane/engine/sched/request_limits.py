"""What one request may ever hold, and the checks that a request fits it.

A request is admitted only if it could finish running alone with every expert the policy
may offload offloaded (`max_kv_tokens`); one that nonetheless never gets its pages is
refused by the liveness guard (liveness.py) rather than preempted and re-admitted for ever.
"""

from __future__ import annotations

from collections.abc import Sequence

from rimuru.dataplane.engine.experts.residency_table import ResidencyTable
from rimuru.dataplane.engine.sched.policy_state import PolicyState
from rimuru.dataplane.engine.sched.request import SamplingParams
from rimuru.dataplane.memory.geometry import PageGeometry, PageType
from rimuru.dataplane.memory.pool import UnifiedPool
from rimuru.dataplane.model.config import ModelConfig
from rimuru.dataplane.policies import memory_policy
from rimuru.policy import EXPERT_MATRICES, Tunables


class RequestLimits:
    """Reads the residency in force (`residency`) and the policy in force (`policy`) at each
    call; `num_pad_pages` (the CUDA graphs' padding pages) is the caller's, since the
    graphs are built after this object and may be rebuilt."""

    def __init__(
        self,
        model_config: ModelConfig,
        geometry: PageGeometry,
        pool: UnifiedPool,
        residency: ResidencyTable,
        policy: PolicyState,
        *,
        num_state_layers: int,
        block_size: int,
        max_model_len: int,
    ):
        self.model_config = model_config
        self.geometry = geometry
        self.pool = pool
        self.residency = residency
        self.policy = policy
        self.num_state_layers = num_state_layers
        self.block_size = block_size
        self.max_model_len = max_model_len

    def max_kv_tokens(self, num_pad_pages: int, tunables: Tunables | None = None) -> int:
        """Tokens one request could hold if every expert the policy (`tunables`, else the
        one in force) may offload were offloaded."""
        mc, t = self.model_config, tunables or self.policy.tunables
        total_expert_pages = self.pool.num_pages(PageType.EXPERT)
        # each layer at the fewest residents the policy may leave it (a layer already below
        # that, after a live lowering of the limit, stays where it is)
        keep = memory_policy(t).least_kept(mc.num_experts, t)
        kept = [len(r) if keep is None else min(len(r), keep) for r in self.residency.resident]
        min_resident = sum(kept)
        offloaded = max(mc.num_experts - k for k in kept)
        # device copy-in: a loading slot (three pool pages) per expert the most offloading
        # layer leaves on the host
        slots = self.residency.loading_slots
        slot_pages = 3 * min(slots.num_slots, offloaded) if slots is not None else 0
        kv_pages = (
            total_expert_pages - min_resident * EXPERT_MATRICES - slot_pages
        ) * self.geometry.kv_pages_per_expert_page - num_pad_pages
        # A hybrid's state pages, in KV pages: the whole parent pages they are cut from (a
        # lone request shares them with no one). Counting their bytes only let a request
        # through that, alone in the pool, lacked a page: preempted, re-admitted and
        # preempted again, it never finished.
        state = self.geometry.state_parent_bytes(self.num_state_layers)
        kv_pages -= -(-state // self.geometry.kv_page_bytes)
        return max(0, kv_pages // mc.num_kv_layers) * self.block_size

    def validate(
        self, prompt_token_ids: Sequence[int], params: SamplingParams, num_pad_pages: int
    ) -> list[int]:
        """Raise ValueError (saying what would fit) unless the request can ever run; its
        prompt as a list of ints otherwise."""
        ids = [int(t) for t in prompt_token_ids]
        if not ids:
            raise ValueError("the prompt is empty: give at least one token")
        vocab = self.model_config.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary [0, {vocab})")
        total = len(ids) + params.max_tokens
        if total > self.max_model_len:
            room = self.max_model_len - len(ids)
            fix = (
                f"shorten the prompt or lower max_tokens to {room}"
                if room >= 1
                else f"shorten the prompt to at most {self.max_model_len - 1} tokens"
            )
            raise ValueError(
                f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) = {total} exceeds "
                f"the model's context of {self.max_model_len} tokens: {fix}"
            )
        fits = self.max_kv_tokens(num_pad_pages)
        if total > fits:
            t = self.policy.tunables
            why = (
                f"even with expert_offload_limit={t.expert_offload_limit} experts "
                f"offloaded per layer"
                if memory_policy(t).moves_boundary
                else f"with the {t.mode} policy's resident experts"
            )
            raise ValueError(
                f"prompt + max_tokens = {total} tokens can never fit in this pool: at most {fits} "
                f"tokens fit {why}; raise the memory budget or lower max_tokens"
            )
        return ids
