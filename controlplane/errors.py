"""Domain errors of the control plane; status.py maps them to gRPC codes (the one place)."""

from __future__ import annotations

from rimuru.policy import InvalidPolicy


class ControlPlaneError(Exception):
    """Base of every error the control plane reports to a caller."""


class InvalidArgument(ControlPlaneError, InvalidPolicy):
    """A request field is out of range or inconsistent; `field` names it (dotted path).
    The policy vocabulary raises its base, InvalidPolicy: catch that (or DOMAIN_ERRORS)
    where a tunables or ranking rule may fail."""


# What a servicer maps to a status and a CLI reports: the control plane's errors and the
# policy vocabulary's (INVALID_ARGUMENT).
DOMAIN_ERRORS = (ControlPlaneError, InvalidPolicy)


class NotFound(ControlPlaneError, LookupError):
    pass


class VersionConflict(ControlPlaneError):
    """Compare-and-set lost: the current version is not the expected one."""


class FailedPrecondition(ControlPlaneError):
    pass


class Unauthenticated(ControlPlaneError):
    pass


class AlreadyExists(ControlPlaneError):
    """The name is in use, e.g. a node id with a connected WatchPolicy stream."""


class ResourceExhausted(ControlPlaneError):
    """A bounded table (e.g. the subscribers) is full."""


class Unavailable(ControlPlaneError):
    """The control plane could not be reached (client side); retrying may help."""
