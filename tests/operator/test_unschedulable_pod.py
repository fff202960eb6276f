"""A data-plane pod the scheduler cannot place (a surge pod with no free GPU, the price of
the one-replica rollout that keeps serving) is named in Progressing with the scheduler's
message, instead of a rollout that only reads "0 updated" for ever."""

from __future__ import annotations

from rimuru.operator.pod_failures import dataplane_unschedulable
from tests.operator.test_apply_and_status import _obs, _status

NO_GPU = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."


def _pod(name: str, scheduled: dict) -> dict:
    return {
        "metadata": {"name": name},
        "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", **scheduled}]},
    }


def test_the_scheduler_says_why_a_pod_waits():
    placed = _pod("tiny-dataplane-a", {"status": "True"})
    waiting = _pod("tiny-dataplane-b", {"status": "False", "reason": "Unschedulable",
                                        "message": NO_GPU})  # fmt: skip
    assert dataplane_unschedulable([]) is None
    assert dataplane_unschedulable([placed]) is None
    assert (
        dataplane_unschedulable([placed, waiting])
        == f"pod tiny-dataplane-b unschedulable: {NO_GPU}"
    )


def test_progressing_names_the_unschedulable_pod():
    pending = f"pod tiny-dataplane-b unschedulable: {NO_GPU}"
    obs = _obs(current_replicas=3, updated_replicas=1, dataplane_unschedulable=pending)
    progressing = next(c for c in _status(obs)["conditions"] if c["type"] == "Progressing")
    assert (progressing["status"], progressing["reason"]) == ("True", "RollingOut")
    assert progressing["message"] == f"1 updated, 2 ready of 2; {pending}"
