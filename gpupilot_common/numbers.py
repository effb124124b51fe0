"""Numbers from the command line, checked where they are parsed.

Each factory returns an ``argparse`` ``type=`` callable: it turns the flag's text into a number and
refuses NaN, infinities and values out of range with :class:`argparse.ArgumentTypeError`, whose
message argparse prints as one line (``argument --interval: …``) before exiting with status 2.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

_MAX_TEXT = 64
"""Longer flag values are not numbers anyone typed; they are not echoed whole either."""


def _shown(text: str) -> str:
    return repr(text if len(text) <= _MAX_TEXT else text[:_MAX_TEXT] + "…")


def _range_text(
    low: float | None, high: float | None, *, low_open: bool, unit: str, show: Callable[[float], str]
) -> str:
    u = f" {unit}" if unit else ""
    if low is not None and high is not None:
        if low_open:
            return f"more than {show(low)} and at most {show(high)}{u}"
        return f"between {show(low)} and {show(high)}{u}"
    if low is not None:
        return f"more than {show(low)}{u}" if low_open else f"at least {show(low)}{u}"
    if high is not None:
        return f"at most {show(high)}{u}"
    return "a finite number"


def _g(value: float) -> str:
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else f"{value:g}"


def check_range(
    value: float,
    *,
    text: str,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    unit: str = "",
    show: Callable[[float], str] = _g,
) -> float:
    """``value`` if finite and within [low, high] (or (low, high] with ``low_open``); ``show``
    writes the bounds in the message (e.g. :func:`gpupilot_common.timefmt.format_duration`)."""
    if not math.isfinite(value):
        bounds = (
            ""
            if low is None and high is None
            else f" (must be {_range_text(low, high, low_open=low_open, unit=unit, show=show)})"
        )
        raise argparse.ArgumentTypeError(f"{_shown(text)} is not a finite number{bounds}")
    below = low is not None and (value <= low if low_open else value < low)
    if below or (high is not None and value > high):
        wanted = _range_text(low, high, low_open=low_open, unit=unit, show=show)
        raise argparse.ArgumentTypeError(f"{_shown(text)}: must be {wanted}")
    return value


def real(
    *, low: float | None = None, high: float | None = None, low_open: bool = False, unit: str = ""
) -> Callable[[str], float]:
    """A finite float within bounds, e.g. ``real(low=0, low_open=True, high=3600, unit="seconds")``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{_shown(text)} is not a number") from None
        return check_range(value, text=text, low=low, high=high, low_open=low_open, unit=unit)

    parse.__name__ = "number"  # argparse names the type in its messages
    return parse


def whole(*, low: int | None = None, high: int | None = None) -> Callable[[str], int]:
    """A whole number within [low, high]."""

    def parse(text: str) -> int:
        stripped = text.strip()
        if len(stripped) > 20 or not stripped.lstrip("+-").isdigit():
            raise argparse.ArgumentTypeError(f"{_shown(text)} is not a whole number")
        value = int(stripped)
        check_range(value, text=text, low=low, high=high)
        return value

    parse.__name__ = "whole number"
    return parse


def bounded(
    parse_text: Callable[[str], float],
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    unit: str = "",
    show: Callable[[float], str] = _g,
) -> Callable[[str], float]:
    """Another parser (a duration, a time) whose result must also be finite and in range.
    ``ValueError`` from ``parse_text`` becomes argparse's one-line error."""

    def parse(text: str) -> float:
        try:
            value = parse_text(text)
        except (ValueError, OverflowError) as exc:
            raise argparse.ArgumentTypeError(str(exc).splitlines()[0] if str(exc) else "invalid") from None
        return check_range(value, text=text, low=low, high=high, low_open=low_open, unit=unit, show=show)

    parse.__name__ = getattr(parse_text, "__name__", "value")
    return parse
