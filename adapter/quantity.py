"""Kubernetes Quantities in canonical decimal form, as the HPA's Go client parses them.

Canonical means an integer mantissa with the largest SI suffix that keeps it an integer:
1.5 → ``1500m``, 75 → ``75``, 2000 → ``2k``, 3e9 → ``3G``, 2.5e-7 → ``250n``. Values finer than a
nano are rounded up to the next nano, as ``resource.Quantity`` does.
"""

from __future__ import annotations

import math
from decimal import ROUND_CEILING, Decimal

_SUFFIXES: tuple[tuple[int, str], ...] = (
    (18, "E"),
    (15, "P"),
    (12, "T"),
    (9, "G"),
    (6, "M"),
    (3, "k"),
    (0, ""),
    (-3, "m"),
    (-6, "u"),
    (-9, "n"),
)


def format_quantity(value: float) -> str:
    """The canonical Quantity string for a finite number; raises ``ValueError`` for NaN/inf."""
    if not math.isfinite(value):
        raise ValueError(f"{value!r} is not a finite number and has no Quantity form")
    fast = _fast(float(value))
    if fast is not None:
        return fast
    exact = Decimal(repr(float(value)))
    if exact == 0:
        return "0"
    sign = "-" if exact < 0 else ""
    magnitude = abs(exact)
    nanos = (magnitude * Decimal(10) ** 9).to_integral_value(rounding=ROUND_CEILING)
    for exponent, suffix in _SUFFIXES:
        shift = exponent + 9
        scale = Decimal(10) ** shift
        if nanos % scale == 0:
            return f"{sign}{int(nanos // scale)}{suffix}"
    raise AssertionError("unreachable: every integer is a whole number of nanos")


_UP = ("", "k", "M", "G", "T", "P", "E")


def _fast(value: float) -> str | None:
    """Whole numbers and whole milli-units without Decimal (most metric values; ~10× faster)."""
    if abs(value) >= 1e15:
        return None
    if value.is_integer():
        n = int(value)
        if n == 0:
            return "0"
        step = 0
        while n % 1000 == 0 and step < len(_UP) - 1:
            n //= 1000
            step += 1
        return f"{n}{_UP[step]}"
    milli = value * 1000
    if milli.is_integer():
        return f"{int(milli)}m"
    return None


_PARSE_SUFFIXES = {suffix: Decimal(10) ** exp for exp, suffix in _SUFFIXES if suffix}
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


def parse_quantity(text: str | int | float) -> float:
    """Read a Quantity (``75``, ``750m``, ``1.5``, ``2Gi``, ``3e9``) as a float."""
    if isinstance(text, int | float):
        return float(text)
    raw = text.strip()
    for suffix, factor in _BINARY.items():
        if raw.endswith(suffix):
            return float(Decimal(raw[: -len(suffix)]) * factor)
    if raw and raw[-1] in _PARSE_SUFFIXES and not raw[-1].isdigit():
        try:
            return float(Decimal(raw[:-1]) * _PARSE_SUFFIXES[raw[-1]])
        except ArithmeticError as exc:
            raise ValueError(f"{text!r} is not a Kubernetes quantity") from exc
    try:
        return float(Decimal(raw))
    except ArithmeticError as exc:
        raise ValueError(f"{text!r} is not a Kubernetes quantity (e.g. 75, 750m, 2Gi)") from exc
