"""What the expert plane counts for metrics: one object, written by the residency table
(evictions, loads and their copies) and the copy-in (copies into loading buffers or
slots, the predictor's hits), read by the step log, the copy budget and the metrics
exporter. Cumulative since start-up; the engine resets them once start-up residency is
loaded, and a live policy reload saves and restores them (re-placing the start-up set is
not serving traffic)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass
class ExpertCounters:
    evictions: int = 0
    loads: int = 0  # experts brought back into pool pages by the adjuster
    buffer_copies: int = 0  # experts copied into a loading buffer (or slot) for one step
    bytes_h2d: int = 0
    predictor_hits: int = 0  # non-resident experts needed and already prefetched
    predictor_needed: int = 0  # non-resident experts needed

    def snapshot(self) -> ExpertCounters:
        """A copy that later changes leave alone (for `restore`)."""
        return dataclasses.replace(self)

    def restore(self, saved: ExpertCounters) -> None:
        """Every count back to `saved`'s, in place: the writers keep this object."""
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(saved, f.name))

    def reset(self) -> None:
        self.restore(ExpertCounters())
