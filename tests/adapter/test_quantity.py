"""Quantities: canonical Kubernetes form of metric values, and parsing HPA targets."""

import math

import pytest

from adapter.quantity import format_quantity, parse_quantity


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (1.5, "1500m"),
        (75, "75"),
        (75.0, "75"),
        (3e9, "3G"),
        (2000, "2k"),
        (1500, "1500"),
        (0, "0"),
        (0.1, "100m"),
        (2.5e-7, "250n"),
        (1e-12, "1n"),  # finer than a nano rounds up, as resource.Quantity does
        (-1.5, "-1500m"),
        (1048576.0, "1048576"),
        (20000 * 1048576.0, "20971520k"),
        (33.333333333333336, "33333333334n"),
        (1e18, "1E"),
    ],
)
def test_canonical_form(value: float, text: str) -> None:
    assert format_quantity(value) == text


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_values_have_no_quantity(bad: float) -> None:
    with pytest.raises(ValueError, match="not a finite number"):
        format_quantity(bad)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("75", 75.0),
        ("750m", 0.75),
        ("1.5k", 1500.0),
        ("2Gi", 2.0 * 2**30),
        ("3e9", 3e9),
        ("10", 10.0),
        (10, 10.0),
    ],
)
def test_parse(text: str | int, value: float) -> None:
    assert parse_quantity(text) == pytest.approx(value)


def test_parse_rejects_garbage() -> None:
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        parse_quantity("seventy")


def test_round_trip() -> None:
    for v in (0.75, 12.5, 80.0, 3e9, 0.001):
        assert parse_quantity(format_quantity(v)) == pytest.approx(v)
