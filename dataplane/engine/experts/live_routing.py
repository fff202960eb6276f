"""Routing as the engine sees it now: the cost rule's prices (adjust/payoff.py) use it.

The hotness ranking orders evictions (it is the policy's, replaced only by a push); but the
copies an offloaded expert costs depend on how often it is routed now, which a ranking
profiled on a few prompts, or on yesterday's traffic, can misjudge. So the cost rule prices
each expert by its share of recent routing: the MoE backend's routing counts, read every
`refresh_steps` steps (one small device read), decayed so that the window follows the load.
Until every MoE layer has routed `min_tokens` pairs in the window, the ranking's shares
stand (the offline ranking seeds the estimate).

A window's counts are noisy, and the rule picks the experts whose counts are lowest: those are
partly the ones that drew low by chance, and are routed more afterwards (regression to the mean:
unshrunk, the rule underprices what it evicts, most where routing is near uniform). So each
layer's counts are shrunk toward the layer's mean by the share of their spread that chance
explains (`shrunk`): where routing is near uniform the shares come out near uniform, and where
it is skewed (a Zipf law, as the presets' default skew 1 makes it) they barely move.
"""

from __future__ import annotations

from rimuru.dataplane.engine.experts.moe_backend import MoEBackend
from rimuru.policy import HotnessRanking

UNSEEN_PAIRS = 1.0  # added to every expert's window count (observe says why)


class LiveRouting:
    def __init__(self, refresh_steps: int = 32, decay: float = 0.5, min_tokens: int = 256):
        if refresh_steps < 1 or not 0 <= decay < 1 or min_tokens < 1:
            raise ValueError("need refresh_steps >= 1, decay in [0, 1) and min_tokens >= 1")
        self.refresh_steps, self.decay, self.min_tokens = refresh_steps, decay, min_tokens
        self._last: list[list[int]] | None = None  # cumulative counts at the last read
        self.window: list[list[float]] | None = None  # [L][E] decayed routed pairs
        # sum of decay^k and of decay^2k over the reads in the window: a count's chance
        # variance over its mean is their ratio (shrunk)
        self._weight = self._weight2 = 0.0
        self.ranking_now: HotnessRanking | None = None  # from the window; None while thin
        self._next_read = 0

    def ranking(self, moe: MoEBackend, step: int) -> HotnessRanking | None:
        """Shares of recent routing as a ranking, or None while the window is too thin."""
        if step >= self._next_read:
            self._next_read = step + self.refresh_steps
            self.observe(moe.routing_counts.tolist())
        return self.ranking_now

    def observe(self, counts: list[list[int]]) -> None:
        """Fold in cumulative counts [L][E]; counts below the last read mean they were reset
        (a hotness profile, a graph capture): then all of them are new."""
        last = self._last
        pairs = [] if last is None else list(zip(counts, last, strict=True))
        reset = last is None or any(
            c < p for row, prev in pairs for c, p in zip(row, prev, strict=True)
        )
        delta = counts if reset else [
            [c - p for c, p in zip(row, prev, strict=True)] for row, prev in pairs
        ]  # fmt: skip
        window = self.window or [[0.0] * len(row) for row in counts]
        self.window = [
            [self.decay * w + d for w, d in zip(wrow, drow, strict=True)]
            for wrow, drow in zip(window, delta, strict=True)
        ]
        self._last = [list(row) for row in counts]
        self._weight = self.decay * self._weight + 1.0
        self._weight2 = self.decay**2 * self._weight2 + 1.0
        thin = min(sum(row) for row in self.window) < self.min_tokens
        if thin:
            self.ranking_now = None
            return
        # One pair more for every expert: an expert unseen in the window is rare, not never
        # routed, and priced at 0 its eviction would pay whatever a copy costs.
        noise = self._weight2 / self._weight
        seen = [shrunk([w + UNSEEN_PAIRS for w in row], noise) for row in self.window]
        self.ranking_now = HotnessRanking.from_counts(seen, "live")


def shrunk(row: list[float], noise: float) -> list[float]:
    """A layer's window counts moved toward their mean m by the share of their variance
    across experts that chance explains: each count, routed at random at its expert's rate,
    varies by `noise` times its mean (1 for a plain count; less for a decayed window), so
    about noise * m of the observed variance v is chance, and each count keeps the share
    1 - noise * m / v of its distance from m (none where v is no more than chance's)."""
    m = sum(row) / len(row)
    v = sum((w - m) ** 2 for w in row) / len(row)
    keep = max(0.0, 1.0 - noise * m / v) if v > 0 else 0.0
    return [m + keep * (w - m) for w in row]
