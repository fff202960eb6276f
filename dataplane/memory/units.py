"""Byte sizes as people write them: `28.8GiB`, `512MiB`, `4e9`, `1024`."""

from __future__ import annotations

import math
import re

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_MAX_BYTES = 2**63 - 1  # torch sizes are int64; no device comes near this
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str | int) -> int:
    """Parse a byte size; raises ValueError naming the accepted forms."""
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"byte size must be >= 0, got {text}")
        return text
    match = _PATTERN.match(str(text))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise ValueError(
            f"cannot read byte size {text!r}: write a number with an optional unit "
            f"(B, KB, MB, GB, TB, KiB, MiB, GiB, TiB), e.g. '28.8GiB'"
        )
    number = float(match.group(1))
    if not unit and 0 < number < 1:
        # As bytes it rounds to 0 ("must be > 0"). Not every flag that reads sizes has a share
        # of the GPU beside it (`plan`, `generate`, `--activation-reserve`): no flag is named.
        raise ValueError(f"byte size {text!r} is less than one byte: give a unit, e.g. '{text}GiB'")
    num_bytes = number * _UNITS[unit]
    if not math.isfinite(num_bytes) or num_bytes > _MAX_BYTES:
        raise ValueError(f"byte size {text!r} is too large: at most {_MAX_BYTES} bytes (8 EiB)")
    return int(num_bytes)


def format_bytes(num_bytes: int) -> str:
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{value:.1f} {unit}" if unit != "B" else f"{int(value)} B"
        value /= 1024
    return f"{value:.2f} TiB"
