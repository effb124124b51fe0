"""Durations as people write them on command lines and in configs: ``90``, ``30s``, ``15m``, ``2h``, ``7d``."""

from __future__ import annotations

import re

_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw]?)")


def parse_duration(text: str) -> float:
    """Seconds in ``text`` (``1h30m`` allowed); ``ValueError`` with a one-line message otherwise."""
    raw = str(text).strip().lower()
    pos, total = 0, 0.0
    while pos < len(raw):
        m = _PART.match(raw, pos)
        if m is None:
            break
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if not raw or pos != len(raw):
        raise ValueError(f"{text!r} is not a duration (examples: 90, 30s, 15m, 2h, 7d)")
    return total
