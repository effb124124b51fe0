"""Kubernetes Quantities as the HPA reads them.

Values are served **truncated to milli-units**, as prometheus-adapter does
(``resource.NewMilliQuantity(int64(value * 1000), DecimalSI)``): the HPA controller works in int64
milli-units anyway (``Quantity.MilliValue()``), so finer digits would only make the served text differ
from the anchor's (``80.00000000000001`` would read as ``80000000001n``, i.e. 80.000000000 01, where
prometheus-adapter serves ``80``). Canonical form: the largest SI suffix that keeps an integer
mantissa: 1.5 → ``1500m``, 75 → ``75``, 2000 → ``2k``, 3e9 → ``3G``, 2.5e-4 → ``0``.
"""

from __future__ import annotations

import math
from decimal import Decimal

from hpa_controller.milli import target_milli, to_milli

__all__ = ["format_milli", "format_quantity", "parse_quantity", "target_milli", "to_milli"]

_UP = ("", "k", "M", "G", "T", "P", "E")


def format_milli(milli: int) -> str:
    """Canonical Quantity text for a whole number of milli-units."""
    if milli == 0:
        return "0"
    if milli % 1000:
        return f"{milli}m"
    n, step = milli // 1000, 0
    while n % 1000 == 0 and step < len(_UP) - 1:
        n //= 1000
        step += 1
    return f"{n}{_UP[step]}"


def format_quantity(value: float) -> str:
    """The Quantity string served for a metric value (truncated to milli-units); ``ValueError`` for
    NaN/inf."""
    return format_milli(to_milli(value))


_PARSE_SUFFIXES = {
    "n": Decimal(10) ** -9,
    "u": Decimal(10) ** -6,
    "m": Decimal(10) ** -3,
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
}
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


def parse_quantity(text: str | int | float) -> float:
    """Read a Quantity (``75``, ``750m``, ``1.5``, ``2Gi``, ``3e9``) as a float."""
    if isinstance(text, bool) or not isinstance(text, str | int | float):
        raise ValueError(f"{str(text)[:40]!r} is not a Kubernetes quantity (e.g. 75, 750m, 2Gi)")
    if isinstance(text, int | float):
        if not math.isfinite(text):
            raise ValueError(f"{text!r} is not a finite quantity")
        return float(text)
    raw = text.strip()
    try:
        for suffix, factor in _BINARY.items():
            if raw.endswith(suffix):
                return _finite(text, Decimal(raw[: -len(suffix)]) * factor)
        if raw and raw[-1] in _PARSE_SUFFIXES and not raw[-1].isdigit():
            return _finite(text, Decimal(raw[:-1]) * _PARSE_SUFFIXES[raw[-1]])
        return _finite(text, Decimal(raw))
    except ArithmeticError as exc:
        raise ValueError(f"{text!r} is not a Kubernetes quantity (e.g. 75, 750m, 2Gi)") from exc


def _finite(text: object, value: Decimal) -> float:
    out = float(value)
    if not math.isfinite(out):
        raise ValueError(f"{text!r} is not a finite quantity")
    return out
