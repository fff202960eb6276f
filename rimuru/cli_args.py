"""argparse value types shared by the subcommands: a bad value is a usage error (exit 2)
before anything is built, never a wrapped port or a count whose sign changes its meaning.

Lives in the root package because both planes use it and the data plane may not import
rimuru.controlplane (nor the control plane torch).
"""

from __future__ import annotations

import argparse

MAX_PORT = 65535


def port(text: str) -> int:
    """A TCP port, 0 = any free port (the OS picks; the log says which)."""
    value = _int(text)
    if not 0 <= value <= MAX_PORT:
        raise argparse.ArgumentTypeError(
            f"port must lie in 0..{MAX_PORT} (0 = any free port), got {value}"
        )
    return value


def target(text: str) -> str:
    """HOST:PORT of a server to reach: a port grpc would wrap, or none, is refused here
    rather than reported later as a refused connection to another port. A Unix socket
    (`unix:PATH`, `unix-abstract:NAME`) has no port."""
    if text.startswith(("unix:", "unix-abstract:")):
        return text
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    value = _int(port_text)
    if not 1 <= value <= MAX_PORT:
        raise argparse.ArgumentTypeError(f"the port must lie in 1..{MAX_PORT}, got {text!r}")
    return text


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "WARN", "ERROR", "CRITICAL")


def log_level(text: str) -> str:
    """A logging level name, any case; a type, not `choices`, so that a default read from
    the environment is checked too."""
    level = text.strip().upper()
    if level not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(LOG_LEVELS)}, got {text!r}")
    return level


def positive_int(text: str) -> int:
    """A count of at least 1."""
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
