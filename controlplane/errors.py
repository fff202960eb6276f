"""Domain errors of the control plane; status.py maps them to gRPC codes (the one place)."""

from __future__ import annotations


class ControlPlaneError(Exception):
    """Base of every error the control plane reports to a caller."""


class InvalidArgument(ControlPlaneError, ValueError):
    """A request field is out of range or inconsistent; `field` names it (dotted path)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class NotFound(ControlPlaneError, LookupError):
    pass


class VersionConflict(ControlPlaneError):
    """Compare-and-set lost: the current version is not the expected one."""


class FailedPrecondition(ControlPlaneError):
    pass


class Unauthenticated(ControlPlaneError):
    pass


class Unavailable(ControlPlaneError):
    """The control plane could not be reached (client side); retrying may help."""
