"""Values as the HPA controller reads them: int64 milli-units (``Quantity.MilliValue()``)."""

from __future__ import annotations

import functools
import math
from decimal import ROUND_CEILING, ROUND_DOWN, Decimal

_INT64_MAX = 2**63 - 1


@functools.lru_cache(maxsize=8192)
def to_milli(value: float) -> int:
    """``value`` in milli-units, truncated toward zero (Go's ``int64(value * 1000)``), computed on the
    decimal text of the float so that 31.666 gives 31666, not 31665 (31.666 × 1000 in binary is
    31665.999…). Clamped to the int64 range like the controller's overflow guards."""
    if not math.isfinite(value):
        raise ValueError(f"{value!r} is not a finite number and has no Quantity form")
    milli = value * 1000.0
    if milli.is_integer() and abs(milli) < 2**53:
        out = int(milli)
    else:
        out = int((Decimal(repr(float(value))) * 1000).to_integral_value(rounding=ROUND_DOWN))
    return max(-_INT64_MAX - 1, min(_INT64_MAX, out))


def target_milli(value: float) -> int:
    """An HPA target's ``MilliValue()``: rounded **up** to a whole milli-unit (``0.0005`` → 1)."""
    if not math.isfinite(value):
        raise ValueError(f"{value!r} is not a finite number")
    return int((Decimal(repr(float(value))) * 1000).to_integral_value(rounding=ROUND_CEILING))
