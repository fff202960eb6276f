"""The step log keeps a bounded window of records and totals over every step."""

import pytest

from rimuru.dataplane.engine.engine import Engine
from rimuru.dataplane.engine.sched.request import SamplingParams
from rimuru.dataplane.engine.sched.step_log import StepLog
from rimuru.dataplane.engine.startup.config import EngineConfig


def test_an_engine_keeps_the_last_records_and_counts_every_step():
    engine = Engine(EngineConfig(max_num_batched_tokens=64), log_plan=False)
    engine.stats = StepLog(window=8)
    engine.generate([[1, 2, 3]], SamplingParams(max_tokens=20, ignore_eos=True))
    log = engine.stats
    assert log.num_steps == engine.step_id == 20  # one prompt step + 19 decode steps
    assert len(log) == 8 and [s.step for s in log] == list(range(13, 21))
    assert log.num_scheduled_tokens == 3 + 19
    assert log[-1].step == 20 and log[0].step == 13
    assert [s.step for s in log.since(17)] == [18, 19, 20]
    assert log.at(15).step == 15 and log.at(12) is None and log.at(21) is None
    assert log.dropped_since(0) == 12 and log.dropped_since(12) == 0 and log.dropped_since(15) == 0


def test_an_empty_log_and_a_window_below_one():
    log = StepLog(window=4)
    assert len(log) == 0 and log.since(0) == [] and log.at(1) is None
    assert log.dropped_since(0) == 0
    with pytest.raises(ValueError, match="at least one record"):
        StepLog(window=0)
