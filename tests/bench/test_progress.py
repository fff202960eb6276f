"""The request progress bar counts finished requests and refuses to run backwards."""

from __future__ import annotations

import io

import pytest

from rimuru.dataplane.bench.progress import RequestProgress


def test_progress_shows_finished_out_of_total():
    out = io.StringIO()
    with RequestProgress(5, desc="elastic", disable=False, file=out) as bar:
        bar.advance_to(3, running=2)
        bar.advance_to(5)
    text = out.getvalue()
    assert "elastic" in text and "5/5" in text and "running=2" in text
    assert bar.num_finished == 5


def test_progress_is_silent_when_disabled_and_checks_counts():
    out = io.StringIO()
    with RequestProgress(4, disable=True, file=out) as bar:
        bar.advance_to(2)
        with pytest.raises(ValueError, match=r"between 2 .* and 4, got 1"):
            bar.advance_to(1)
        with pytest.raises(ValueError, match="got 5"):
            bar.advance_to(5)
    assert out.getvalue() == ""
