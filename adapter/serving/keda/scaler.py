"""What KEDA's external scaler calls answer, without the transport: a trigger's metadata → its
metric spec, value and activity, read from the same refreshing cache as the external metrics API.

The value of a trigger is the sum of the external metric's series for (metric, namespace,
labelSelector): the number the HPA would take from ``external.metrics.k8s.io`` for the same metric
and selector (it adds up the items of the list). Nothing is ever taken as 0: no series (an empty
result, or only series older than ``--max-value-age``, which the query leaves out) is
:class:`NotFound`; a refresh that has failed for longer than ``--max-value-age`` is
:class:`UpstreamUnavailable`; KEDA then keeps its last decision or applies the ScaledObject's
``fallback`` instead of scaling towards zero (keda#3065).

A sum is served only when every member can be: one series that is NaN or ±Inf, beyond ±9.2e15
(KEDA multiplies by 1000 into an int64) or outside the metric's ``valueRange`` makes the whole
value :class:`UpstreamUnavailable`, naming that series, and so does a sum beyond ±9.2e15. Leaving
the bad series out, as the external metrics API leaves out one item of a list, would serve a
smaller sum with status OK and scale the workload down on a broken series. So the scaler reads the
query's answer itself (from the same refreshing cache, under its own key), before any series is
left out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping
from typing import NamedTuple, Protocol

from adapter.clients.prometheus import Sample
from adapter.errors import BadRequest, NotFound, UpstreamUnavailable
from adapter.provider.valuecheck import QUANTITY_MAX
from adapter.provider.values import MetricValues
from adapter.serving.keda import metadata
from adapter.serving.keda.metadata import Trigger


class _Cache(Protocol):
    def get(self, key: Hashable, load: Callable[[], list[Sample]], *, wait: float) -> object: ...


class Reading(NamedTuple):
    trigger: Trigger
    value: float

    @property
    def active(self) -> bool:
        """KEDA's activation: active while the value is above ``activationValue``."""
        return self.value > self.trigger.activation


class Scaler:
    def __init__(
        self,
        *,
        values: MetricValues,
        query: Callable[[str], list[Sample]],
        cache: _Cache | None = None,
        wait: float = 6.0,
    ) -> None:
        self._values = values
        self._query = query
        """Prometheus' instant query: the answer as given, NaN and ±Inf included."""
        self._cache = cache
        self._wait = wait

    def trigger(self, scaler_metadata: Mapping[str, str]) -> Trigger:
        """The trigger's metadata, parsed and checked against the config's external metrics."""
        trigger = metadata.parse(scaler_metadata)
        try:
            self._values.external_rule(trigger.metric)
        except NotFound:
            raise BadRequest(
                f"scalerMetadata.metric {metadata.shown(trigger.metric)}: not an external metric of the adapter's "
                "config; use a name from its 'external:' section"
            ) from None
        return trigger

    def _samples(self, query: str) -> list[Sample]:
        if self._cache is None:
            return self._query(query)
        entry = self._cache.get(("keda", query), lambda: self._query(query), wait=self._wait)
        return entry.value  # type: ignore[attr-defined,no-any-return]

    def read(self, *, namespace: str, scaler_metadata: Mapping[str, str]) -> Reading:
        trigger = self.trigger(scaler_metadata)
        rule, query = self._values.external_query(
            metric=trigger.metric, namespace=namespace, selector=trigger.selector
        )
        found = self._samples(query)
        if not found:
            age = self._values.max_value_age
            raise NotFound(
                f"external metric {trigger.metric} in namespace {namespace or '(none)'}"
                + (f" with labelSelector {trigger.selector}" if not trigger.selector.empty else "")
                + " has no value"
                + (f" newer than {age:g}s" if age > 0 else "")
                + ": an empty result is not taken as 0; check the series in Prometheus"
            )
        what = f"external metric {trigger.metric} in namespace {namespace or '(none)'}"
        for s in found:
            why = _refused(s.value, rule.value_range)
            if why:
                raise UpstreamUnavailable(
                    f"{what}: series {_labels(s.labels)} is {s.value:g}, {why}; the sum is not served "
                    "(KEDA keeps its last decision); check the metric's query"
                )
        total = math.fsum(s.value for s in found)
        if abs(total) > QUANTITY_MAX:
            raise UpstreamUnavailable(
                f"{what}: the sum of {len(found)} series is {total:g}, beyond ±9.2e15 (KEDA multiplies "
                "it by 1000 into a 64-bit integer); check the metric's query"
            )
        return Reading(trigger, total)


def _refused(value: float, value_range: tuple[float, float] | None) -> str:
    if not math.isfinite(value):
        return "not a number KEDA can scale on"
    if abs(value) > QUANTITY_MAX:
        return "beyond ±9.2e15 (KEDA multiplies it by 1000 into a 64-bit integer)"
    if value_range is not None and not value_range[0] <= value <= value_range[1]:
        return f"outside the metric's valueRange [{value_range[0]:g}, {value_range[1]:g}]"
    return ""


def _labels(labels: Mapping[str, str]) -> str:
    text = "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if k != "__name__") + "}"
    return text if len(text) <= 200 else text[:199] + "…}"
