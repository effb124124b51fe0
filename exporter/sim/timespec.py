"""Durations (``90s``, ``2h30m``, ``1d``) and points in time (ISO 8601, Unix seconds, ``now-14d``)."""

from __future__ import annotations

import datetime as dt
import re

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")


def parse_duration(value: object) -> float:
    """Seconds from ``15s``, ``2h30m``, ``1.5d`` or a bare number of seconds; ``ValueError`` otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration (use e.g. 15s, 5m, 2h30m, 1d)")
    if isinstance(value, int | float):
        return float(value)
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a duration (use e.g. 15s, 5m, 2h30m, 1d)")
    text = value.strip()
    try:
        return float(text)
    except ValueError:
        pass
    pos, total = 0, 0.0
    for m in _PART.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos != len(text) or not text:
        raise ValueError(f"{value!r} is not a duration (use e.g. 15s, 5m, 2h30m, 1d)")
    return total


def parse_time(value: object, *, now: float) -> float:
    """Unix seconds from ``2026-11-01T00:00:00Z``, ``2026-11-01``, ``1764000000``, ``now`` or ``now-7d``."""
    if isinstance(value, dt.datetime):
        moment = value if value.tzinfo else value.replace(tzinfo=dt.UTC)
        return moment.timestamp()
    if isinstance(value, dt.date):
        return dt.datetime(value.year, value.month, value.day, tzinfo=dt.UTC).timestamp()
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a time (use ISO 8601, Unix seconds or now-7d)")
    text = value.strip()
    if text == "now":
        return now
    rel = re.fullmatch(r"now\s*([-+])\s*(\S+)", text)
    if rel:
        delta = parse_duration(rel.group(2))
        return now - delta if rel.group(1) == "-" else now + delta
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"{value!r} is not a time (use ISO 8601 like 2026-11-01T00:00:00Z, Unix seconds, now or now-7d)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return moment.timestamp()


def format_time(t: float) -> str:
    return dt.datetime.fromtimestamp(t, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
