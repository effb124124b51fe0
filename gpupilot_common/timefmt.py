"""One vocabulary for time across gpupilot: durations in Prometheus' grammar, times in RFC 3339.

Durations are what Prometheus writes (``90s``, ``15m``, ``1h30m``, ``7d``, ``2w``, ``1y``; units
``ms s m h d w y`` from largest to smallest, each at most once), plus a bare number of seconds
(``90``, ``0.5``) because configs and flags have always taken one. Decimals are accepted in a part
(``1.5h``) where Prometheus only takes integers; nothing Prometheus accepts is refused.

Every parsed value is checked: finite, within ``[minimum, maximum]`` (by default more than zero and
at most ten years), so ``nan``, ``0`` where it means nothing and ``99999999999999999999d`` end as
one line, not as a spinning loop or a multi-gigabyte range.
"""

from __future__ import annotations

import datetime as dt
import math
import re

#: Seconds per unit, Prometheus' units (a year is 365 days, as in Prometheus).
UNITS: dict[str, float] = {
    "y": 365 * 86400.0,
    "w": 7 * 86400.0,
    "d": 86400.0,
    "h": 3600.0,
    "m": 60.0,
    "s": 1.0,
    "ms": 0.001,
}
_ORDER = list(UNITS)
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|y|w|d|h|m|s)")
_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")
TEN_YEARS = 10 * UNITS["y"]
_HINT = "use e.g. 30s, 15m, 1h30m, 7d"


def parse_duration(
    value: object,
    *,
    minimum: float = 0.0,
    maximum: float = TEN_YEARS,
    allow_zero: bool = False,
) -> float:
    """Seconds in ``value``; ``ValueError`` with a one-line message when it is not a duration or
    is out of range (zero is refused unless ``allow_zero``; below ``minimum`` or above ``maximum``)."""
    seconds = _seconds(value)
    if not math.isfinite(seconds):
        raise ValueError(f"{_show(value)} is not a finite duration ({_HINT})")
    if seconds < 0:
        raise ValueError(f"{_show(value)} is negative ({_HINT})")
    if seconds == 0 and not allow_zero:
        raise ValueError(f"{_show(value)} is zero; a duration here must be positive ({_HINT})")
    if seconds < minimum and not (seconds == 0 and allow_zero):
        raise ValueError(f"{_show(value)} is shorter than the minimum {format_duration(minimum)}")
    if seconds > maximum:
        raise ValueError(f"{_show(value)} is longer than the maximum {format_duration(maximum)}")
    return seconds


def _seconds(value: object) -> float:
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration ({_HINT})")
    if isinstance(value, int | float):
        return float(value)
    if not isinstance(value, str):
        raise ValueError(f"{_show(value)} is not a duration ({_HINT})")
    text = value.strip()
    if _NUMBER.fullmatch(text) or text.lower() in {"nan", "inf", "+inf", "-inf", "infinity"}:
        return float(text)
    pos, total, last_rank = 0, 0.0, -1
    for m in _PART.finditer(text):
        rank = _ORDER.index(m.group(2))
        if m.start() != pos or rank <= last_rank:
            break
        total += float(m.group(1)) * UNITS[m.group(2)]
        pos, last_rank = m.end(), rank
    if not text or pos != len(text):
        raise ValueError(f"{_show(value)} is not a duration ({_HINT})")
    return total


def format_duration(seconds: float) -> str:
    """Prometheus' form of ``seconds``: ``5400`` → ``1h30m``, ``604800`` → ``1w``, ``0.25`` → ``250ms``."""
    if not math.isfinite(seconds):
        return str(seconds)
    ms = round(seconds * 1000)
    if ms == 0:
        return "0s"
    parts = []
    for unit in _ORDER:
        size = round(UNITS[unit] * 1000)
        count, ms = divmod(ms, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)


def format_time(t: float | dt.datetime) -> str:
    """RFC 3339 in UTC to the second: ``2026-11-30T15:22:02Z``."""
    moment = t if isinstance(t, dt.datetime) else dt.datetime.fromtimestamp(t, tz=dt.UTC)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: object, *, now: float) -> float:
    """Unix seconds from RFC 3339 / ISO 8601 (``2026-11-01T00:00:00Z``, ``2026-11-01``; no zone
    means UTC), Unix seconds, ``now`` or ``now-7d``; ``ValueError`` with one line otherwise."""
    if isinstance(value, dt.datetime):
        moment = value if value.tzinfo else value.replace(tzinfo=dt.UTC)
        return moment.timestamp()
    if isinstance(value, dt.date):
        return dt.datetime(value.year, value.month, value.day, tzinfo=dt.UTC).timestamp()
    if isinstance(value, int | float) and not isinstance(value, bool):
        return _finite_time(float(value), value)
    if not isinstance(value, str):
        raise ValueError(f"{_show(value)} is not a time (use RFC 3339, Unix seconds or now-7d)")
    text = value.strip()
    if text == "now":
        return now
    rel = re.fullmatch(r"now\s*([-+])\s*(\S+)", text)
    if rel:
        delta = parse_duration(rel.group(2))
        return now - delta if rel.group(1) == "-" else now + delta
    if _NUMBER.fullmatch(text):
        return _finite_time(float(text), value)
    try:
        moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"{_show(value)} is not a time (use RFC 3339 like 2026-11-01T00:00:00Z, Unix seconds, now or now-7d)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return moment.timestamp()


def _finite_time(t: float, shown: object) -> float:
    # Year 1970 to 9999: anything else is a typo, and datetime cannot format it anyway.
    if not math.isfinite(t) or not 0 <= t < 253402300800:
        raise ValueError(f"{_show(shown)} is not a time between 1970 and 9999")
    return t


def _show(value: object) -> str:
    """``repr`` cut to 60 characters: never echo an unbounded value."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
