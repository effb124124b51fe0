"""Numbers read from series labels, checked one series at a time.

A label value is text whoever runs the exporter (or anything else writing the same metric names)
controls: ``placement_start="x"``, ``gpu="1e400"``, ``memory_total_mib="inf"``. A value that is not
the number it should be makes its series unusable, never the whole plan: the reader raises
:class:`MalformedLabel` for that series, and the inventory sets the node aside with one line naming
the node, the series and the label (:func:`rightsizer.analysis.history.inventory`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from gpupilot_common.text import one_line


class MalformedLabel(ValueError):
    """A label whose value is not the number it should be."""

    def __init__(self, name: str, value: str, expected: str) -> None:
        super().__init__(f"label {name}={one_line(value, limit=60)!r} is not {expected}")
        self.name, self.value = name, value


def whole(labels: Mapping[str, str], name: str, *, default: int, high: int = 1_000_000) -> int:
    """The label as a whole number in ``[0, high)`` (``default`` when absent or empty)."""
    text = labels.get(name, "") or ""
    if not text:
        return default
    try:
        value = int(text, 10)
    except ValueError:
        raise MalformedLabel(name, text, f"a whole number below {high:,}") from None
    if not 0 <= value < high:
        raise MalformedLabel(name, text, f"a whole number below {high:,}")
    return value


def amount(labels: Mapping[str, str], name: str, *, default: float, high: float) -> float:
    """The label as a finite number in ``[0, high)`` (``default`` when absent or empty)."""
    text = labels.get(name, "") or ""
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise MalformedLabel(name, text, f"a number below {high:,.0f}") from None
    if not math.isfinite(value) or not 0 <= value < high:
        raise MalformedLabel(name, text, f"a finite number below {high:,.0f}")
    return value
