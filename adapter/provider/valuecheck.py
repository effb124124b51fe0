"""Values checked at the door: what Prometheus answers is served to the HPA only if it can mean
something.

* NaN and ±Inf are skipped (an absent value, as for a series without a sample) and counted.
* A value whose magnitude a Kubernetes Quantity cannot carry (the HPA reads int64 milli-units, so
  beyond ±9.2e15) is refused for that object, never clamped: 1e308 served as the largest int64
  would drive an HPA to ``maxReplicas``.
* A value outside the metric's ``valueRange`` (in the mapping file: 0–100 for a utilisation) is
  refused for that object: 140 % utilisation is a broken series, not a reason to scale.
* Two or more series for one object (a template that does not aggregate, two exporters for one
  pod) are refused for that object: no silent pick between 10 and 90.

Each refusal is logged (one line per evaluation, naming the metric, the object and the reason) and
counted in ``gpupilot_adapter_values_refused_total{reason}``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import Counter

from adapter.clients.prometheus import Sample

log = logging.getLogger(__name__)

QUANTITY_MAX = (2**63 - 1) / 1000.0
"""The largest magnitude an int64 count of milli-units holds (about 9.2e15)."""

NOT_FINITE = "not_finite"
BEYOND_QUANTITY = "beyond_quantity"
DUPLICATE_SERIES = "duplicate_series"
OUT_OF_RANGE = "out_of_range"


class ValueCheck:
    """The checks, with their counter (in ``registry``; unregistered when None, as in the tools)."""

    def __init__(self, registry: Any = None) -> None:
        self.refused = Counter(
            "gpupilot_adapter_values_refused_total",
            "Values from Prometheus not served, by reason: not_finite (NaN/Inf, skipped), "
            "beyond_quantity (more than a Kubernetes Quantity carries), out_of_range (outside the "
            "metric's valueRange), duplicate_series (several series for one object).",
            ["reason"],
            registry=registry,
        )
        for reason in (NOT_FINITE, BEYOND_QUANTITY, OUT_OF_RANGE, DUPLICATE_SERIES):
            self.refused.labels(reason)

    def value(self, value: float, value_range: tuple[float, float] | None = None) -> str | None:
        """Why ``value`` cannot be served (counted), or None."""
        if not math.isfinite(value):
            reason = NOT_FINITE
        elif abs(value) > QUANTITY_MAX:
            reason = BEYOND_QUANTITY
        elif value_range is not None and not value_range[0] <= value <= value_range[1]:
            reason = OUT_OF_RANGE
        else:
            return None
        self.refused.labels(reason).inc()
        return reason

    def per_object(
        self,
        samples: Iterable[Sample],
        *,
        label: str,
        metric: str,
        value_range: tuple[float, float] | None = None,
    ) -> dict[str, Sample]:
        """One sample per object (the value of ``label``; a sample without it is no object's), every
        refusal left out and logged."""
        first: dict[str, Sample] = {}
        duplicates: dict[str, list[float]] = {}
        refused: list[str] = []
        for s in samples:
            name = s.labels.get(label)
            if not name:
                continue
            if name in duplicates:
                duplicates[name].append(s.value)
                continue
            if name in first:
                duplicates[name] = [first.pop(name).value, s.value]
                continue
            reason = self.value(s.value, value_range)
            if reason is None:
                first[name] = s
            elif reason != NOT_FINITE:
                refused.append(f"{label} {name}: {_why(s.value, reason, value_range)}")
        for name, values in duplicates.items():
            self.refused.labels(DUPLICATE_SERIES).inc()
            shown = ", ".join(f"{v:g}" for v in values[:4])
            refused.append(
                f"{label} {name}: {len(values)} series ({shown}); the query must give one per object "
                "(aggregate with sum by/max by)"
            )
        if refused:
            more = f" and {len(refused) - 1} more" if len(refused) > 1 else ""
            log.warning("metric %s: not served for %s%s", metric, refused[0], more)
        return first

    def external(
        self, samples: Iterable[Sample], *, metric: str, value_range: tuple[float, float] | None = None
    ) -> list[Sample]:
        """External metrics: every series is its own item; refused values are left out."""
        out = []
        for s in samples:
            reason = self.value(s.value, value_range)
            if reason is None:
                out.append(s)
            elif reason != NOT_FINITE:
                log.warning(
                    "external metric %s: %s not served: %s",
                    metric,
                    _labels(s.labels),
                    _why(s.value, reason, value_range),
                )
        return out


def _why(value: float, reason: str, value_range: tuple[float, float] | None) -> str:
    if reason == OUT_OF_RANGE and value_range is not None:
        return f"{value:g} is outside the metric's valueRange [{value_range[0]:g}, {value_range[1]:g}]"
    return f"{value:g} is beyond what a Quantity carries (±9.2e15)"


def _labels(labels: Mapping[str, str]) -> str:
    return "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if k != "__name__") + "}"
