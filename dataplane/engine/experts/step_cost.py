"""The measured StepCost the cost-aware elastic rule prices evictions with (adjust/payoff.py).

    per_copy   one expert's copy to the device, timed at start-up as the engine copies it
               (device copy-in's kernel, else a memcpy from pinned memory)
    fixed      a decode step's time that does not grow with the batch
    per_seq    what each decode sequence adds

fixed and per_seq are fitted to the engine's own decode steps (exponentially weighted least
squares of T - per_copy * copies on B, so the fit follows the load); mixed steps are left
out: their prompt tokens' time grows with the output rate and cancels in the rule, as
per_seq does (payoff.py). Until enough decode steps were seen, fixed is the time to read
the resident weights once at the device's measured copy bandwidth (a decode step reads at
least that) and per_seq is 0.

Copies, unlike time, are priced over every step (payoff.StepMix): the meter also keeps, with
the same decay, the share of steps that carry prompt tokens and how many tokens those carry
beyond one per sequence. Until a step was seen the mix is decode-only.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from rimuru.dataplane.adjust.payoff import DECODE_ONLY, StepCost, StepMix
from rimuru.dataplane.model.weights import ExpertWeights

MIN_DECODE_STEPS = 8  # before this many, the seed stands


def _timed(work: Callable[[], None], device: torch.device, repeats: int) -> float:
    """Seconds per call of `work` on `device` (the fastest of `repeats`, after one warm call)."""
    work()
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            work()
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) / 1e3)
        else:
            began = time.perf_counter()
            work()
            best = min(best, time.perf_counter() - began)
    return best


def _timed_copy(dst: torch.Tensor, src: torch.Tensor, repeats: int) -> float:
    """Seconds per copy of src into dst."""
    return _timed(lambda: dst.copy_(src, non_blocking=True), dst.device, repeats)


def measure_copy_seconds(device: torch.device, expert_bytes: int, repeats: int = 5) -> float:
    """Seconds to copy one expert from (pinned) host memory to `device`."""
    pin = device.type == "cuda"
    src = torch.empty(expert_bytes, dtype=torch.uint8, pin_memory=pin)
    dst = torch.empty(expert_bytes, dtype=torch.uint8, device=device)
    return _timed_copy(dst, src, repeats)


def measure_copy_in_seconds(
    copy_kernel: Callable[..., None], host: ExpertWeights, device: torch.device
) -> float:
    """Seconds for device copy-in (`copy_kernel`, device_copy.py) to copy one routed expert of
    `host` (a layer's pinned experts) into pages on `device`. One, not several side by side:
    a step copies an offloaded expert into its layer's slot right before that layer's MoE,
    and a layer seldom has more than one to copy. The kernel itself is timed, not a memcpy:
    it reads host memory through unified addressing, slower than the copy engines, so copies
    priced by a memcpy would look cheaper than they are."""
    num_experts, inter, hidden = host.w1.shape
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device)
    counts[0] = 1
    offloaded = torch.tensor([0], dtype=torch.int32, device=device)
    pages = torch.empty(3, inter * hidden, dtype=host.w1.dtype, device=device)
    rows = torch.arange(3, dtype=torch.int32, device=device)
    copied = torch.zeros(1, dtype=torch.int32, device=device)

    def copy() -> None:
        copy_kernel(counts, offloaded, host.w1, host.w3, host.w2, pages, rows, copied)

    return _timed(copy, device, repeats=5)


def measure_read_seconds(device: torch.device, nbytes: int) -> float:
    """Seconds to read `nbytes` of device memory once, from a timed device-to-device copy
    (a copy reads and writes each byte: half its time is the read). The probe is large
    enough on a GPU for its events to time it well, small on the CPU, where every engine
    a test builds pays for it."""
    probe_bytes = 64 << 20 if device.type == "cuda" else 4 << 20
    probe = max(1, min(nbytes, probe_bytes))
    src = torch.empty(probe, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return _timed_copy(dst, src, repeats=3) / 2 * (nbytes / probe)


class StepCostMeter:
    def __init__(self, per_copy: float, seed_fixed: float, decay: float = 0.97):
        if per_copy < 0 or seed_fixed <= 0 or not 0 < decay < 1:
            raise ValueError("need per_copy >= 0, seed_fixed > 0 and decay in (0, 1)")
        self.per_copy, self.seed_fixed, self.decay = per_copy, seed_fixed, decay
        self.num_steps = 0
        self.recent_step_s = 0.0  # decode steps' time, a moving average over ~10 steps
        self._w = self._x = self._y = self._xx = self._xy = 0.0  # weighted sums
        self._steps = self._mixed = self._extra = 0.0  # weighted sums over every step

    @classmethod
    def measured(
        cls,
        device: torch.device,
        expert_bytes: int,
        *,
        all_weight_bytes: int,
        copy_in: tuple[Callable[..., None], ExpertWeights] | None = None,
    ) -> StepCostMeter:
        """Priced on `device`: one expert's copy timed (`copy_in`: device copy-in's kernel
        and a layer's host experts, else a memcpy), the seed one read of every weight."""
        per_copy = (
            measure_copy_in_seconds(*copy_in, device)
            if copy_in is not None
            else measure_copy_seconds(device, expert_bytes)
        )
        return cls(per_copy=per_copy, seed_fixed=measure_read_seconds(device, all_weight_bytes))

    def record(self, batch: int, num_tokens: int, copies: int, seconds: float) -> None:
        """One step of `batch` sequences that routed `num_tokens` tokens through the MoE
        layers (as many as sequences: a decode-only step) and copied `copies` experts in."""
        if batch < 1:
            return
        extra = max(num_tokens - batch, 0)
        d = self.decay
        self._steps = d * self._steps + 1.0
        self._mixed = d * self._mixed + (extra > 0)
        self._extra = d * self._extra + extra
        if extra or seconds <= 0:  # the fit is of decode-only steps
            return
        first = self.num_steps == 0
        self.recent_step_s = (
            seconds if first else self.recent_step_s + 0.1 * (seconds - self.recent_step_s)
        )
        y = max(seconds - self.per_copy * copies, 0.0)
        self._w = d * self._w + 1.0
        self._x = d * self._x + batch
        self._y = d * self._y + y
        self._xx = d * self._xx + batch * batch
        self._xy = d * self._xy + batch * y
        self.num_steps += 1

    def mix(self) -> StepMix:
        """The steps seen lately: the share with prompt tokens, and their extra tokens."""
        if not self._mixed:
            return DECODE_ONLY
        return StepMix(min(self._mixed / self._steps, 1.0), self._extra / self._mixed)

    def cost(self) -> StepCost:
        if self.num_steps < MIN_DECODE_STEPS:
            return StepCost(self.seed_fixed, 0.0, self.per_copy)
        mean_x, mean_y = self._x / self._w, self._y / self._w
        var = self._xx / self._w - mean_x * mean_x
        slope = (self._xy / self._w - mean_x * mean_y) / var if var > 1e-9 else 0.0
        per_seq = max(slope, 0.0)
        fixed = mean_y - per_seq * mean_x
        if fixed <= 0:  # the steps grew faster than linearly: all of it per sequence
            per_seq, fixed = max(mean_y, 1e-9) / max(mean_x, 1.0), 1e-9
        return StepCost(fixed, per_seq, self.per_copy)
