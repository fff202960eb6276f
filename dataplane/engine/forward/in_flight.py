"""A launched step until it is read back, and what the next step takes from it on the device.

Every step starts its read-back as soon as it is launched: the sampled tokens (and the
device's count of expert copies) are copied to pinned host memory behind the step's
kernels, with an event after the copy. Reading them waits for that event only, so a step
launched after this one keeps the device busy meanwhile. Synchronous scheduling reads a
step back at once; async scheduling (EngineConfig.schedules_async) first schedules and
launches the next round, whose decodes take their last token from this step's sampled
tokens on the device (TokenFill): the host never waits for a token to build a step.

What must stay true: one stream orders everything that touches a step's tensors, so the
next step's writes (its input buffers, KV pages reused in stream order) land after this
step's reads; and a step is read back before the one after it (tokens in order).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rimuru.dataplane.engine.experts.copy_in import CopyIn
from rimuru.dataplane.engine.forward.pinned_upload import to_device
from rimuru.dataplane.engine.sched.request import Request


@dataclass
class Readback:
    """A step's sampled tokens [R] and copy count, on their way to the host."""

    values: torch.Tensor | None  # int64, pinned on CUDA; None: nothing to read
    done: torch.cuda.Event | None  # recorded after the copy (CUDA only)
    num_tokens: int
    counts_copies: bool

    @classmethod
    def start(
        cls,
        sampled: tuple[torch.Tensor, torch.Tensor] | None,
        copy_in: CopyIn,
        device: torch.device,
    ) -> Readback:
        """Queue the copy behind the step's kernels; returns at once on CUDA. The device's
        copy count restarts behind the copy, so the next step counts only its own.
        `sampled`: the tokens [R] and, per row, whether its logits held a NaN or an
        infinity [R] bool (read beside the tokens, so reporting them costs no wait)."""
        tokens, nonfinite = sampled if sampled is not None else (None, None)
        count = copy_in.device_count()
        counter = count.on_device if count is not None else None
        parts = [t.to(torch.int64) for t in (tokens, nonfinite, counter) if t is not None]
        values, done = None, None
        if parts:
            on_device = torch.cat(parts)
            if device.type == "cuda":
                values = torch.empty(on_device.shape, dtype=torch.int64, pin_memory=True)
                values.copy_(on_device, non_blocking=True)
            else:
                values = on_device
            if count is not None:
                count.restart()
        if device.type == "cuda":
            done = torch.cuda.Event()
            done.record()
        num_tokens = 0 if tokens is None else int(tokens.shape[0])
        return cls(values, done, num_tokens, counter is not None)

    def wait(self, copy_in: CopyIn) -> tuple[list[int], list[bool]]:
        """The step's one wait on the device: after it the step's forward has finished.
        Returns the sampled tokens and, per token, whether its logits were not finite
        (the token is then meaningless); counts the expert copies the device made."""
        if self.done is not None:
            self.done.synchronize()
        if self.values is None:
            return [], []
        values = self.values.tolist()
        if self.counts_copies:
            copy_in.device_count().add(values.pop())
        n = self.num_tokens
        return values[:n], [bool(v) for v in values[n : 2 * n]]


@dataclass
class InFlightStep:
    """A launched step: the requests it samples for, in row order, and their read-back."""

    step: int
    sampled: list[Request]
    tokens: torch.Tensor | None  # [R] on the device: what the next step's decodes read
    readback: Readback


@dataclass(frozen=True)
class TokenFill:
    """Input rows of a step whose token is still a placeholder, and where on the device it
    is: applied to the step's input ids after they are uploaded, before its forward."""

    rows: torch.Tensor  # [k] int64: rows of the step's input ids
    values: torch.Tensor  # [k] int64: their tokens, gathered from the step in flight

    @classmethod
    def build(
        cls, rows: Sequence[int], requests: Sequence[Request], prev: InFlightStep
    ) -> TokenFill:
        """`rows[i]` takes the token `prev` sampled for `requests[i]`."""
        if prev.tokens is None:
            raise RuntimeError("a placeholder refers to a step that sampled nothing")
        # built here, not per launched step: synchronous scheduling never asks
        row_of = {r.request_id: i for i, r in enumerate(prev.sampled)}
        index = torch.tensor([list(rows), [row_of[r.request_id] for r in requests]])
        index = to_device(index, prev.tokens.device)  # one staged copy, no wait
        return cls(index[0], prev.tokens.index_select(0, index[1]))

    def apply(self, input_ids: torch.Tensor) -> None:
        """Write the tokens into `input_ids` [T] (on the device), in place."""
        input_ids.index_copy_(0, self.rows, self.values.to(input_ids.dtype))
