"""engine/experts/copy_budget.py's CopyMeter: the copies decode steps make, averaged (the hold it
drives is tested in test_copy_budget.py)."""

from rimuru.dataplane.engine.experts.copy_budget import CopyMeter


def test_the_meter_averages_decode_steps_only():
    meter = CopyMeter(alpha=0.5)
    meter.update(8, decode_only=True)
    assert meter.value == 4.0
    meter.update(100, decode_only=False)  # a prompt step: copies whatever the budget
    assert meter.value == 4.0
    meter.update(0, decode_only=True)
    assert meter.value == 2.0
