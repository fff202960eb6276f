"""Sizes as people write them, one grammar for every command and the operator: a number
with an optional unit.

    engine byte sizes   28.8GiB  512MiB  2 GB  4e9  1024        (B-suffixed, any case)
    Kubernetes          60Gi  1.5G  64M  500m  1024             (suffixes as Kubernetes spells them)

Binary units are powers of 1024 (Ki/KiB ... Ei/EiB), decimal ones powers of 1000 (k/KB ...
E/EB), `m` is a thousandth (a Kubernetes quantity such as CPU "500m"; never whole bytes).
Stdlib only: the operator's image has no torch.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

_BINARY = {p: 1024**i for i, p in enumerate("KMGTPE", start=1)}
_DECIMAL = {p: 1000**i for i, p in enumerate("KMGTPE", start=1)}
_MAX_BYTES = 2**63 - 1  # torch sizes are int64; no device comes near this
_SIZE = re.compile(
    r"^\s*\+?((?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$"
)
FORMS = "B, KB/MB/GB/TB, KiB/MiB/GiB/TiB, or Kubernetes' k/M/G/T, Ki/Mi/Gi/Ti"
# Kubernetes' own spelling alone (resource.Quantity, decimal SI and binary suffixes): no
# exponent, space or B-suffixed unit.
_KUBERNETES = re.compile(r"^\+?([0-9]+(?:\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[kMGTPEm])?$")


def _multiplier(unit: str) -> Decimal | int | None:
    if unit in ("", "B", "b"):
        return 1
    if unit == "m":
        return Decimal("0.001")
    if unit == "k":
        return 1000
    head, tail = unit[:1].upper(), unit[1:]
    if head not in _BINARY:
        return None
    if tail in ("i", "iB") or tail.lower() == "ib":  # Kubernetes' Gi, the engine's GiB/gib
        return _BINARY[head]
    if (tail == "" and unit[0].isupper()) or tail.lower() == "b":  # G, GB, gb
        return _DECIMAL[head]
    return None


def size_value(text: Any, *, kubernetes: bool = False) -> Decimal | None:
    """The number a size or quantity stands for ("60Gi", "1.5G", "500m", "2 GB", 1024), or
    None if it is not one. `kubernetes`: Kubernetes' spelling only (what an API server
    accepts and rewrites as a quantity), so "1e3" or "2 GB" are not quantities there."""
    if isinstance(text, bool) or not isinstance(text, int | float | str | Decimal):
        return None
    if kubernetes and _KUBERNETES.match(str(text)) is None:
        return None
    match = _SIZE.match(str(text))
    if match is None:
        return None
    unit = _multiplier(match.group(2))
    if unit is None:
        return None
    try:
        return Decimal(match.group(1)) * unit
    except ArithmeticError:  # an exponent past Decimal's range (InvalidOperation, Overflow)
        return None


def parse_bytes(text: str | int) -> int:
    """A byte size as whole bytes; ValueError naming the accepted forms."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"byte size must be >= 0, got {text}")
        if text > _MAX_BYTES:
            raise ValueError(f"byte size {text} is too large: at most {_MAX_BYTES} bytes (8 EiB)")
        return text
    value = size_value(text)
    if value is None or _SIZE.match(str(text)).group(2) == "m":  # thousandths of a byte
        raise ValueError(
            f"cannot read byte size {text!r}: write a number with an optional unit "
            f"({FORMS}), e.g. '28.8GiB'"
        )
    if 0 < value < 1 and _SIZE.match(str(text)).group(2) == "":
        # As bytes it rounds to 0 ("must be > 0"). Not every flag that reads sizes has a share
        # of the GPU beside it (`plan`, `generate`, `--activation-reserve`): no flag is named.
        raise ValueError(f"byte size {text!r} is less than one byte: give a unit, e.g. '{text}GiB'")
    if value > _MAX_BYTES:
        raise ValueError(f"byte size {text!r} is too large: at most {_MAX_BYTES} bytes (8 EiB)")
    return int(value)


def format_bytes(num_bytes: int) -> str:
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{value:.1f} {unit}" if unit != "B" else f"{int(value)} B"
        value /= 1024
    return f"{value:.2f} TiB"
