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
        rows = [i for i, p in enumerate(params) if p.temperature >= SAMPLING_EPS]
        probs = self._filtered_probs(logits[rows], [params[i] for i in rows])
        picks = torch.empty(len(rows), dtype=torch.int64, device=logits.device)
        seeded = [j for j, i in enumerate(rows) if params[i].seed is not None]
        unseeded = [j for j, i in enumerate(rows) if params[i].seed is None]
        if unseeded:
            picks[unseeded] = torch.multinomial(probs[unseeded], 1).squeeze(1)
        for j in seeded:  # each seeded request draws from its own generator, batch or not
            i = rows[j]
            generator = self._generator(request_ids[i], params[i], logits.device)
            picks[j] = torch.multinomial(probs[j], 1, generator=generator)[0]
        tokens[rows] = picks
        return tokens.tolist()

    @staticmethod
    def _filtered_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
        """[R, V] logits -> [R, V] probabilities after temperature, top-k and top-p, in
        vocabulary order. One pass for all rows: the filters work on a sorted copy and are
        scattered back, so the draw itself runs in vocabulary order, where a tiny change of
        the logits (another batch, another policy) moves the pick only at a boundary; in
        sorted order two near-equal tokens swapping places would change it outright."""
        device, vocab = logits.device, logits.shape[-1]
        temperature = torch.tensor([p.temperature for p in params], device=device)
        top_k = torch.tensor(
            [p.top_k if 0 < p.top_k < vocab else vocab for p in params], device=device
        )
        top_p = torch.tensor([p.top_p for p in params], device=device)
        scaled = logits.float() / temperature[:, None]
        ranked, order = torch.sort(scaled, dim=-1, descending=True)
        positions = torch.arange(vocab, device=device)
        # top-k keeps every logit >= the k-th largest (ties at the k-th are kept)
        kth = ranked.gather(1, (top_k - 1)[:, None])
        keep = ranked >= kth
        # top-p keeps the smallest prefix whose mass reaches top_p (always the first token)
        sorted_probs = torch.softmax(ranked.masked_fill(~keep, float("-inf")), dim=-1)
        before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        keep &= (before < top_p[:, None]) | (positions == 0) | (top_p >= 1.0)[:, None]
        keep = torch.zeros_like(keep).scatter_(1, order, keep)  # back to vocabulary order
        return torch.softmax(scaled.masked_fill(~keep, float("-inf")), dim=-1)

    def _generator(
        self, request_id: str, p: SamplingParams, device: torch.device
    ) -> torch.Generator | None:
        """A per-request generator on the logits' device (CPU and CUDA streams differ)."""
        if p.seed is None:
            return None
        if request_id not in self._generators:
            self._generators[request_id] = torch.Generator(device=device).manual_seed(p.seed)
        return self._generators[request_id]
