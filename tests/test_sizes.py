"""One size grammar for the engine's flags and the operator's Kubernetes quantities."""

from decimal import Decimal

import pytest

from rimuru.sizes import format_bytes, parse_bytes, size_value


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("28.8GiB", int(28.8 * 2**30)),
        ("512MiB", 512 * 2**20),
        ("512mib", 512 * 2**20),
        ("4e9", 4_000_000_000),
        ("1024", 1024),
        (1024, 1024),
        ("2 GB", 2 * 10**9),
        ("60Gi", 60 * 2**30),  # Kubernetes' spellings
        ("1.5G", 1_500_000_000),
        ("64M", 64_000_000),
        ("8k", 8000),
        ("+3Ki", 3072),
    ],
)
def test_bytes_in_either_spelling(text, value):
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["lots", "5g", "5m", "1.5Gx", "", "GiB", True])
def test_what_is_not_a_byte_size_is_refused_saying_what_to_write(text):
    with pytest.raises(ValueError, match=r"e\.g\. '28\.8GiB'"):
        parse_bytes(text)


@pytest.mark.parametrize("text", ["0.9", ".5", "0.99"])
def test_a_unitless_fraction_asks_for_a_unit(text):
    """As bytes, 0.9 rounded to 0 ("must be > 0"), which did not say what to write."""
    with pytest.raises(ValueError, match=f"give a unit, e.g. '{text}GiB'"):
        parse_bytes(text)
    assert parse_bytes(text + "GiB") == int(float(text) * 2**30)


@pytest.mark.parametrize("text", ["1e30", "1e400", "1e19", "9EiB"])
def test_a_size_no_device_has_is_a_value_error(text):
    with pytest.raises(ValueError, match=rf"byte size '{text}' is too large"):
        parse_bytes(text)


def test_limits_and_quantities():
    with pytest.raises(ValueError, match=">= 0"):
        parse_bytes(-1)
    with pytest.raises(ValueError, match="too large"):
        parse_bytes(10**30)
    assert size_value("1e999999999Gi") is None  # past Decimal's exponents: not a size
    # Kubernetes' spelling alone where the API server's quantities are compared
    assert size_value("1Gi", kubernetes=True) == 2**30 and size_value("500m", kubernetes=True)
    assert [size_value(t, kubernetes=True) for t in ("1e3", "2 GB", "1GiB")] == [None] * 3
    assert size_value("500m") == Decimal("0.5")  # a CPU quantity, never bytes
    assert size_value("1Gi") == size_value("1073741824") and size_value([1]) is None
    assert format_bytes(1536) == "1.5 KiB" and format_bytes(12) == "12 B"
