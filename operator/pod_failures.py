"""Why a data-plane or control-plane pod cannot serve, from what the kubelet reports in its status: the
reason a model failed to load (the engine's last log lines, which the container's
FallbackToLogsOnError termination message carries), an image that cannot be pulled, a
container that cannot be created; and why one waits, unscheduled (most often: no free
GPU for a surge pod). Pure: pods in, one message out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

# Waiting reasons that do not pass by themselves (ContainerCreating and PodInitializing do).
FAILED_WAITING_REASONS = frozenset(
    {
        "CrashLoopBackOff",
        "ImagePullBackOff",
        "ErrImagePull",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)
# Enough of a traceback to see what failed; the status stays small.
MAX_MESSAGE_CHARS = 1500


def _failure(pod: Mapping[str, Any]) -> str | None:
    name = pod.get("metadata", {}).get("name", "?")
    for container in (pod.get("status") or {}).get("containerStatuses") or ():
        state = container.get("state") or {}
        waiting = state.get("waiting") or {}
        last = (container.get("lastState") or {}).get("terminated")
        if waiting.get("reason") in FAILED_WAITING_REASONS:
            message = f"pod {name}: {waiting['reason']}"
        elif _restarted_after_a_crash(state, container, last):
            # Between two back-offs of a crash loop the container runs (loading the model,
            # for minutes) before it fails again: still failing, or Degraded would flap.
            message = f"pod {name}: restarted {container['restartCount']} times, loading"
        else:
            continue
        if last:
            message += f"; last exit code {last.get('exitCode')} ({last.get('reason', '')})"
            if last.get("message"):
                message += f": {last['message'].strip()[-MAX_MESSAGE_CHARS:]}"
        elif waiting.get("message"):
            message += f": {waiting['message'][-MAX_MESSAGE_CHARS:]}"
        return message
    return None


def _restarted_after_a_crash(state, container, last) -> bool:
    return bool(
        state.get("running")
        and not container.get("ready")
        and container.get("restartCount", 0) > 0
        and last
        and last.get("exitCode") not in (None, 0)
    )


def pod_failure(pods: Iterable[Mapping[str, Any]]) -> str | None:
    """The first failing pod's story (by name, so the message is stable), or None: the
    data planes' (a model that does not load) or the control plane's (a bad token file,
    a policy volume it cannot write)."""
    for pod in sorted(pods, key=lambda p: p.get("metadata", {}).get("name", "")):
        failure = _failure(pod)
        if failure is not None:
            return failure
    return None


def dataplane_unschedulable(pods: Iterable[Mapping[str, Any]]) -> str | None:
    """The scheduler's word on the first pod it cannot place (by name), or None."""
    for pod in sorted(pods, key=lambda p: p.get("metadata", {}).get("name", "")):
        for condition in (pod.get("status") or {}).get("conditions") or ():
            if (
                condition.get("type") == "PodScheduled"
                and condition.get("status") == "False"
                and condition.get("reason") == "Unschedulable"
            ):
                name = pod.get("metadata", {}).get("name", "?")
                message = condition.get("message", "")[-MAX_MESSAGE_CHARS:]
                return f"pod {name} unschedulable: {message}"
    return None
