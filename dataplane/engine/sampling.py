"""Token sampling: greedy, temperature, top-k, top-p, per-request seeds.

Shape key: B = requests sampled this step, V = vocab.
"""

from __future__ import annotations

import torch

from rimuru.dataplane.engine.request import SamplingParams

# Temperatures below this sample greedily (as vLLM does): dividing logits by a tiny
# temperature overflows to inf, which no distribution can be drawn from.
SAMPLING_EPS = 1e-5


class Sampler:
    def __init__(self) -> None:
        self._generators: dict[str, torch.Generator] = {}

    def forget(self, request_id: str) -> None:
        self._generators.pop(request_id, None)

    def sample(
        self, logits: torch.Tensor, request_ids: list[str], params: list[SamplingParams]
    ) -> list[int]:
        """logits [B, V] fp32 -> one token id per row, computed where the logits are.

        Greedy rows are one batched argmax; only B token ids cross to the host (copying
        [B, V] logits to the host would move ~150 MB per step at B = 256 on Qwen's vocab)."""
        greedy = [i for i, p in enumerate(params) if p.temperature < SAMPLING_EPS]
        if len(greedy) == len(params):
            return torch.argmax(logits, dim=-1).tolist()
        # Every row's token stays on the device until one copy at the end: a per-row
        # int() would make the host wait for the device once per sampled row.
        tokens = torch.empty(len(params), dtype=torch.int64, device=logits.device)
        if greedy:
            tokens[greedy] = torch.argmax(logits[greedy], dim=-1)
        for i, p in enumerate(params):
            if p.temperature >= SAMPLING_EPS:
                tokens[i] = self._sample_row(logits[i].float(), request_ids[i], p)
        return tokens.tolist()

    def _sample_row(self, row: torch.Tensor, request_id: str, p: SamplingParams) -> torch.Tensor:
        """One token id as a 1-element tensor on the row's device (no host synchronisation:
        masks are applied with masked_fill, not boolean indexing)."""
        row = row / p.temperature  # [V]
        if p.top_k > 0 and p.top_k < row.numel():
            kth = torch.topk(row, p.top_k).values[-1]
            row = row.masked_fill(row < kth, float("-inf"))
        probs = torch.softmax(row, dim=-1)
        if p.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            # keep the smallest prefix whose mass reaches top_p (always the first token)
            drop = torch.cumsum(sorted_probs, 0) - sorted_probs >= p.top_p
            sorted_probs = sorted_probs.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
        generator = self._generator(request_id, p, row.device)
        return torch.multinomial(probs, 1, generator=generator)

    def _generator(
        self, request_id: str, p: SamplingParams, device: torch.device
    ) -> torch.Generator | None:
        """A per-request generator on the logits' device (CPU and CUDA streams differ)."""
        if p.seed is None:
            return None
        if request_id not in self._generators:
            self._generators[request_id] = torch.Generator(device=device).manual_seed(p.seed)
        return self._generators[request_id]
