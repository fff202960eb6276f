"""Stop strings on streamed text: OpenAI's `stop`, matched on the decoded output.

The text before the first stop string is the output; the stop string and what follows are
dropped. While streaming, a tail that could still be the start of a stop string is held
back until the next delta decides it, so no client ever sees text that is later cut.
"""

from __future__ import annotations


class StopStrings:
    def __init__(self, stop: tuple[str, ...]) -> None:
        self._stop = tuple(s for s in stop if s)
        self._hold = max((len(s) for s in self._stop), default=1) - 1
        self._pending = ""  # text received but not yet released
        self.stopped = False

    def add(self, text: str) -> str:
        """The text that may be released now; after a match, `stopped` is True."""
        if self.stopped:
            return ""
        self._pending += text
        cut = min((i for i in (self._pending.find(s) for s in self._stop) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            out, self._pending = self._pending[:cut], ""
            return out
        keep = self._held_tail()
        out = self._pending[: len(self._pending) - keep]
        self._pending = self._pending[len(out) :]
        return out

    def flush(self) -> str:
        """The end of the output: what was held back was no stop string after all."""
        out, self._pending = self._pending, ""
        return "" if self.stopped else out

    def _held_tail(self) -> int:
        """Length of the longest tail of the pending text that begins some stop string."""
        for n in range(min(self._hold, len(self._pending)), 0, -1):
            tail = self._pending[-n:]
            if any(s.startswith(tail) for s in self._stop):
                return n
        return 0
