"""A progress bar for benchmark runs: requests finished out of the total, with an ETA.

A thin wrapper over tqdm. By default the bar shows only on a terminal (tqdm's disable=None),
so logs and CI output stay clean; it writes to stderr so stdout keeps the result table.
"""

from __future__ import annotations

import sys
from typing import IO

from tqdm import tqdm


class RequestProgress:
    """Use as a context manager; call `advance_to` with the running total of finished
    requests (the engine knows totals, not increments)."""

    def __init__(
        self,
        total: int,
        desc: str = "requests",
        disable: bool | None = None,
        file: IO[str] | None = None,
    ) -> None:
        if total < 0:
            raise ValueError(f"total must be >= 0, got {total}")
        self.total = total
        self.num_finished = 0
        self._bar = tqdm(
            total=total,
            desc=desc,
            unit="req",
            disable=disable,
            file=file if file is not None else sys.stderr,
            dynamic_ncols=True,
        )

    def advance_to(self, num_finished: int, **postfix: object) -> None:
        """Show `num_finished` requests done; `postfix` (e.g. running=12) is shown beside."""
        if not self.num_finished <= num_finished <= self.total:
            raise ValueError(
                f"num_finished must stay between {self.num_finished} (already shown) and "
                f"{self.total}, got {num_finished}"
            )
        if postfix:
            self._bar.set_postfix(postfix, refresh=False)
        self._bar.update(num_finished - self.num_finished)
        self.num_finished = num_finished

    def close(self) -> None:
        self._bar.close()

    def __enter__(self) -> RequestProgress:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
