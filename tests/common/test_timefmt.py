"""gpupilot_common.timefmt: Prometheus' duration grammar, RFC 3339 times, bounds on every value."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupilot_common import timefmt


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("15s", 15),
        ("2h30m", 9000),
        ("1h30m", 5400),
        ("1d", 86400),
        ("1.5m", 90),
        ("1w", 604800),
        ("1y", 365 * 86400),
        ("500ms", 0.5),
        ("1m30s500ms", 90.5),
        (42, 42),
        ("7", 7),
        ("0.25", 0.25),
    ],
)
def test_durations(text: object, seconds: float) -> None:
    assert timefmt.parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["", "5 minutes", "1h-2m", "m5", "30m1h", "1h1h", "7D", True, None, [1]])
def test_bad_durations(bad: object) -> None:
    with pytest.raises(ValueError, match="is not a duration"):
        timefmt.parse_duration(bad)


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        ("nan", "not a finite"),
        (float("inf"), "not a finite"),
        ("1e300", "longer than the maximum"),
        ("99999999999999999999d", "longer than the maximum"),
        ("0", "is zero"),
        ("0s", "is zero"),
        (-5, "negative"),
    ],
)
def test_out_of_range_durations(bad: object, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        timefmt.parse_duration(bad)


def test_bounds_are_the_callers() -> None:
    assert timefmt.parse_duration("0s", allow_zero=True) == 0
    with pytest.raises(ValueError, match="shorter than the minimum 1h"):
        timefmt.parse_duration("30m", minimum=3600)
    with pytest.raises(ValueError, match="longer than the maximum 1d"):
        timefmt.parse_duration("2d", maximum=86400)


def test_long_values_are_not_echoed() -> None:
    with pytest.raises(ValueError) as info:
        timefmt.parse_duration("x" * 10_000)
    assert len(str(info.value)) < 150


@pytest.mark.parametrize(
    ("seconds", "text"), [(5400, "1h30m"), (604800, "1w"), (0.25, "250ms"), (90061, "1d1h1m1s"), (0, "0s")]
)
def test_format_duration(seconds: float, text: str) -> None:
    assert timefmt.format_duration(seconds) == text


@given(st.integers(min_value=1, max_value=10 * 365 * 86400 * 1000))
def test_format_then_parse_round_trips(ms: int) -> None:
    assert timefmt.parse_duration(timefmt.format_duration(ms / 1000)) == pytest.approx(ms / 1000)


def test_times() -> None:
    now = 1_796_000_000.0
    assert timefmt.parse_time("2026-01-01T00:00:00Z", now=now) == 1_767_225_600
    assert timefmt.parse_time("2026-01-01T01:00:00+01:00", now=now) == 1_767_225_600
    assert timefmt.parse_time("2026-01-01", now=now) == 1_767_225_600
    assert timefmt.parse_time("now-7d", now=now) == now - 7 * 86400
    assert timefmt.parse_time("now", now=now) == now
    assert timefmt.parse_time("1767225600", now=now) == 1_767_225_600
    assert timefmt.format_time(1_767_225_600) == "2026-01-01T00:00:00Z"
    assert timefmt.format_time(dt.datetime(2026, 1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=1)))) == (
        "2026-01-01T00:00:00Z"
    )
    for bad in ["last tuesday", "nan", "1e300", "-5"]:
        with pytest.raises(ValueError, match="is not a time"):
            timefmt.parse_time(bad, now=now)
