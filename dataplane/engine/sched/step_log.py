"""The engine's per-step records, in bounded memory: a server steps for weeks.

Every step's `StepStats` lands in a window of the most recent `window` records; older ones
are dropped. What outlives the window is already cumulative inside each record (evictions,
loads, copies, bytes, preemptions since start-up), and `num_steps` / `num_scheduled_tokens`
count every step. `rimuru bench` reads its run's records with `since(step)`: a run longer
than the window keeps its last `window` steps (`dropped_since` says how many went).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from rimuru.dataplane.engine.sched.outputs import StepStats

# About 13 MB of records: a benchmark run of thousands of requests keeps every step.
DEFAULT_WINDOW = 32_768


class StepLog:
    def __init__(self, window: int = DEFAULT_WINDOW):
        if window < 1:
            raise ValueError(f"the step log must keep at least one record; got {window}")
        self._recent: deque[StepStats] = deque(maxlen=window)
        self.num_steps = 0  # every step recorded, kept or not
        self.num_scheduled_tokens = 0

    @property
    def window(self) -> int:
        return self._recent.maxlen

    def append(self, record: StepStats) -> None:
        self._recent.append(record)
        self.num_steps += 1
        self.num_scheduled_tokens += record.num_scheduled_tokens

    def __len__(self) -> int:
        return len(self._recent)

    def __iter__(self) -> Iterator[StepStats]:
        return iter(self._recent)

    def __getitem__(self, i: int) -> StepStats:
        """The i-th record kept (negative: from the newest)."""
        return self._recent[i]

    def since(self, step: int) -> list[StepStats]:
        """The records kept of the steps after `step` (an engine's step id), oldest first."""
        return [s for s in self._recent if s.step > step]

    def at(self, step: int) -> StepStats | None:
        """The record of step `step`, if it is still kept."""
        if self._recent and self._recent[0].step <= step <= self._recent[-1].step:
            return self._recent[step - self._recent[0].step]
        return None

    def dropped_since(self, step: int) -> int:
        """Steps after `step` whose records the window has already dropped."""
        if not self._recent:
            return 0
        return max(0, self._recent[0].step - step - 1)
