"""Token sampling: greedy, temperature, top-k, top-p, per-request seeds.

Shape key: B = requests sampled this step, R = rows drawn at random (temperature > 0),
F = rows whose top-k or top-p limits the support, V = vocab.

Both paths draw token i with probability softmax(logits / T)[i] by an exponential race (the
Gumbel-max trick): argmax(logits / T - log E) with E ~ Exp(1), without a sort; only the rows
whose top-k or top-p limits the support pay for one (or, for top-k alone, a top-k). With
Triton kernels (`race=True`, CUDA) the whole batch is one launch (kernels/exponential_race.py):
noise per token from Philox keyed per row, greedy rows included, so a step pays no
per-request launch. The torch path (the CPU's) races in two levels (two_level_race): among
blocks of tokens, then inside the winning block, so it draws a uniform per block and per
token of one block, not per token of the vocabulary. Either way a seeded request's n-th draw
depends only on its seed and n, never on its batch; every draw of noise belongs to a token
(or a block), not to a rank or a place in a running sum, so a tiny change of the logits
(another batch, another policy) moves the pick only where two raced scores nearly tie. The
two paths' streams differ, as CPU and CUDA generators do.
"""

from __future__ import annotations

import math

import torch

from rimuru.dataplane.engine.forward.pinned_upload import to_device
from rimuru.dataplane.engine.sched.request import SamplingParams

# Temperatures below this sample greedily (as vLLM does): dividing logits by a tiny
# temperature overflows to inf, which no distribution can be drawn from.
SAMPLING_EPS = 1e-5


class Sampler:
    def __init__(self, race: bool = False) -> None:
        self._race = race  # one Triton launch per step (CUDA), or the torch path
        self._generators: dict[str, torch.Generator] = {}  # torch path, seeded requests
        self._draws: dict[str, int] = {}  # race path: draws each request has made
        self._buffer = torch.empty(0)  # the torch path's CPU work buffer

    def forget(self, request_id: str) -> None:
        self._generators.pop(request_id, None)
        self._draws.pop(request_id, None)

    def sample(
        self, logits: torch.Tensor, request_ids: list[str], params: list[SamplingParams]
    ) -> list[int]:
        """logits [B, V] fp32 -> one token id per row, on the host (waits for the device)."""
        return self.sample_on_device(logits, request_ids, params).tolist()

    def sample_on_device(
        self, logits: torch.Tensor, request_ids: list[str], params: list[SamplingParams]
    ) -> torch.Tensor:
        """logits [B, V] fp32 -> [B] int64 token ids where the logits are, without waiting:
        the engine reads them in its one wait of the step (copying [B, V] logits to the host
        would move ~150 MB per step at B = 256 on Qwen's vocab)."""
        greedy = [i for i, p in enumerate(params) if p.temperature < SAMPLING_EPS]
        drawn = [i for i, p in enumerate(params) if p.temperature >= SAMPLING_EPS]
        if not drawn:
            return torch.argmax(logits, dim=-1)
        if self._race:
            return self._race_rows(logits, request_ids, params)
        if not greedy:
            return self._draw(logits, request_ids, params)
        device = logits.device
        tokens = torch.empty(len(params), dtype=torch.int64, device=device)  # [B]
        index = _to_device(greedy, torch.int64, device)
        tokens[index] = torch.argmax(logits[index], dim=-1)
        index = _to_device(drawn, torch.int64, device)
        ids, drawn_params = [request_ids[i] for i in drawn], [params[i] for i in drawn]
        tokens[index] = self._draw(logits[index], ids, drawn_params)
        return tokens

    def _draw(
        self, logits: torch.Tensor, request_ids: list[str], params: list[SamplingParams]
    ) -> torch.Tensor:
        """logits [R, V] -> [R] token ids, each drawn from softmax(logits / T) restricted
        to the row's top-k and top-p, by a race in two levels (two_level_race): an exp2 and
        an add a token, where a race over the whole vocabulary takes two logs and a uniform.
        Scores are in base 2 (logits * log2(e) / T, so 2**score = exp(logits / T)): torch's
        CPU exp2 takes a quarter of exp's time. The work buffer persists on the CPU: a fresh
        [R, V] buffer is fresh pages from the OS, which cost more than the math."""
        device, (rows, vocab) = logits.device, logits.shape
        scale = _to_device([LOG2E / p.temperature for p in params], torch.float32, device)
        scores = self._work(rows, vocab, device).copy_(logits)
        scores.mul_(scale[:, None])  # [R, V], base 2
        limited = [j for j, p in enumerate(params) if 0 < p.top_k < vocab or p.top_p < 1.0]
        if len(limited) == len(params):  # (top-p's masses: softmax of scores x ln 2)
            scores = limit_support(scores, params, unit=LN2)
        elif limited:
            index = _to_device(limited, torch.int64, device)
            scores[index] = limit_support(scores[index], [params[j] for j in limited], unit=LN2)
        # 2**-inf = 0: a token outside the support has no weight, and log 0 never wins
        weights = scores.sub_(scores.amax(dim=-1, keepdim=True)).exp2_()
        noise = torch.empty((rows, num_race_draws(vocab)), dtype=torch.float32, device=device)
        seeded = [j for j, p in enumerate(params) if p.seed is not None]
        if len(seeded) < len(params):
            noise.uniform_(_TINY, 1.0)  # unseeded rows share the global generator
        for j in seeded:  # each seeded request draws from its own generator, batch or not
            generator = self._generator(request_ids[j], params[j], device)
            noise[j].uniform_(_TINY, 1.0, generator=generator)
        return two_level_race(weights, noise)

    def _work(self, rows: int, vocab: int, device: torch.device) -> torch.Tensor:
        """A [rows, vocab] fp32 work buffer: kept and grown on the CPU, fresh elsewhere (a
        device's allocator caches its blocks, and the memory plan keeps nothing for it)."""
        if device.type != "cpu":
            return torch.empty((rows, vocab), dtype=torch.float32, device=device)
        if self._buffer.numel() < rows * vocab:
            self._buffer = torch.empty(rows * vocab, dtype=torch.float32)
        return self._buffer[: rows * vocab].view(rows, vocab)

    def _race_rows(
        self, logits: torch.Tensor, request_ids: list[str], params: list[SamplingParams]
    ) -> torch.Tensor:
        """The whole batch in one launch: greedy rows at inverse temperature 0; rows whose
        top-k or top-p limits the support scaled and cut here first, then raced at 1."""
        from rimuru.kernels import exponential_race

        device, vocab = logits.device, logits.shape[-1]
        drawn = [p.temperature >= SAMPLING_EPS for p in params]
        inv_t = [1.0 / p.temperature if d else 0.0 for p, d in zip(params, drawn, strict=True)]
        limited = [j for j, p in enumerate(params)
                   if drawn[j] and (0 < p.top_k < vocab or p.top_p < 1.0)]  # fmt: skip
        if limited:
            index = _to_device(limited, torch.int64, device)
            scale = _to_device([inv_t[j] for j in limited], torch.float32, device)
            logits = logits.float().clone()
            logits[index] = limit_support(
                logits[index] * scale[:, None], [params[j] for j in limited]
            )
            for j in limited:
                inv_t[j] = 1.0
        keys = self._keys(request_ids, params, drawn)
        return exponential_race(
            logits, _to_device(inv_t, torch.float32, device), _to_device(keys, torch.int64, device)
        )

    def _keys(
        self, request_ids: list[str], params: list[SamplingParams], drawn: list[bool]
    ) -> list[int]:
        """Each drawn row's Philox key: a seeded request's from (seed, draws so far), an
        unseeded one's from torch's global generator (as the torch path's noise is)."""
        unseeded = sum(d and p.seed is None for p, d in zip(params, drawn, strict=True))
        fresh = iter(torch.randint(0, 2**62, (unseeded,)).tolist() if unseeded else ())
        keys = []
        for request_id, p, d in zip(request_ids, params, drawn, strict=True):
            if not d:
                keys.append(0)
                continue
            n = self._draws.get(request_id, 0)
            self._draws[request_id] = n + 1
            keys.append(next(fresh) if p.seed is None else mix_key(p.seed, n))
        return keys

    def _generator(
        self, request_id: str, p: SamplingParams, device: torch.device
    ) -> torch.Generator:
        """A per-request generator on the logits' device (CPU and CUDA streams differ)."""
        if request_id not in self._generators:
            self._generators[request_id] = torch.Generator(device=device).manual_seed(p.seed)
        return self._generators[request_id]


RACE_BLOCK = 1024  # tokens per block of the two-level race
LOG2E, LN2 = math.log2(math.e), math.log(2.0)
_TINY = torch.finfo(torch.float32).tiny  # U in [tiny, 1): -log U is finite and > 0


def num_race_draws(vocab: int) -> int:
    """Uniforms one row of two_level_race takes: one per block, then one per token of a block."""
    return -(-vocab // RACE_BLOCK) + RACE_BLOCK


def two_level_race(weights: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """weights [R, V] >= 0 (each row's sum > 0), uniform [R, num_race_draws(V)] in (0, 1)
    -> [R] token ids, token i of a row with probability weights[i] / sum.

    An exponential race (Gumbel-max) in two levels: first among the blocks of RACE_BLOCK
    tokens, each entered at log of its weight (the best of a block's raced tokens is
    Gumbel-distributed at that location), then among the chosen block's tokens, so P(i) =
    P(block) P(i | block) = weights[i] / sum. Every draw belongs to a block or a position,
    never to a place in a running sum, so a tiny change of the weights (another batch's
    rounding) moves the pick only where two raced scores nearly tie: the policies stay
    token-identical. A zero weight (log 0 = -inf) never wins."""
    vocab = weights.shape[1]
    b = RACE_BLOCK
    whole = vocab // b * b
    sums = [weights[:, :whole].unflatten(1, (whole // b, b)).sum(-1)] if whole else []
    if whole < vocab:
        sums.append(weights[:, whole:].sum(-1, keepdim=True))
    block_weights = torch.cat(sums, dim=1)  # [R, blocks]
    blocks = block_weights.shape[1]
    gumbel = uniform.log().neg_().log_().neg_()  # [R, blocks + b]
    block = torch.argmax(block_weights.log() + gumbel[:, :blocks], dim=-1, keepdim=True)
    columns = block * b + torch.arange(b, device=weights.device)  # [R, b]
    inside = weights.gather(1, columns.clamp(max=vocab - 1)) * (columns < vocab)
    return block.squeeze(1) * b + torch.argmax(inside.log() + gumbel[:, blocks:], dim=-1)


def mix_key(seed: int, n: int) -> int:
    """A 63-bit Philox key for draw n of a request seeded `seed` (splitmix64's finaliser:
    nearby seeds and counts give unrelated keys)."""
    mask = 2**64 - 1
    z = (seed * 0x9E3779B97F4A7C15 + (n + 1) * 0xD1B54A32D192ED03) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return (z ^ (z >> 31)) >> 1


def limit_support(
    scaled: torch.Tensor, params: list[SamplingParams], unit: float = 1.0
) -> torch.Tensor:
    """[F, V] scaled logits -> the same with -inf outside each row's top-k and top-p.
    `unit`: what the scores are in, in natural log units (ln 2 for base-2 scores): the
    probabilities are softmax(scaled x unit). Top-k needs only their order.

    top-k keeps every logit >= the k-th largest (ties at the k-th are kept); top-p keeps the
    smallest prefix of the sorted probabilities whose mass reaches top_p (the first token
    always: the mass before it is 0), measured after top-k. Top-k alone needs only the k
    largest values, not a sort."""
    device, vocab = scaled.device, scaled.shape[-1]
    top_k = [p.top_k if 0 < p.top_k < vocab else vocab for p in params]
    kth_index = _to_device([k - 1 for k in top_k], torch.int64, device)[:, None]
    if all(p.top_p >= 1.0 for p in params):
        largest = torch.topk(scaled, max(top_k), dim=-1).values  # [F, max k], descending
        return scaled.masked_fill(scaled < largest.gather(1, kth_index), float("-inf"))
    top_p = _to_device([p.top_p for p in params], torch.float32, device)
    ranked, order = torch.sort(scaled, dim=-1, descending=True)  # [F, V]
    keep = ranked >= ranked.gather(1, kth_index)
    masked = ranked.masked_fill(~keep, float("-inf"))
    sorted_probs = torch.softmax(masked if unit == 1.0 else masked * unit, dim=-1)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    keep &= (mass_before < top_p[:, None]) | (top_p >= 1.0)[:, None]
    keep = torch.zeros_like(keep).scatter_(1, order, keep)  # back to vocabulary order
    return scaled.masked_fill(~keep, float("-inf"))


def _to_device(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A small host list on the device without waiting for the device's queued work (a
    plain torch.tensor(..., device=cuda) synchronises the stream): staged in pinned memory."""
    return to_device(torch.tensor(values, dtype=dtype), device)
