"""What KEDA's external scaler calls answer, without the transport: a trigger's metadata → its
metric spec, value and activity, read from the same refreshing cache as the external metrics API.

The value of a trigger is the sum of the external metric's series for (metric, namespace,
labelSelector): the number the HPA would take from ``external.metrics.k8s.io`` for the same metric
and selector (it adds up the items of the list). Nothing is ever taken as 0: no series (an empty
result, or only series older than ``--max-value-age``, which the query leaves out) is
:class:`NotFound`, a value that is not a number or a refresh that has failed for longer than
``--max-value-age`` is :class:`UpstreamUnavailable`; KEDA then keeps its last decision or applies
the ScaledObject's ``fallback`` instead of scaling towards zero (keda#3065).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import NamedTuple

from adapter.errors import BadRequest, NotFound, UpstreamUnavailable
from adapter.provider.values import MetricValues
from adapter.serving.keda import metadata
from adapter.serving.keda.metadata import Trigger


class Reading(NamedTuple):
    trigger: Trigger
    value: float

    @property
    def active(self) -> bool:
        """KEDA's activation: active while the value is above ``activationValue``."""
        return self.value > self.trigger.activation


class Scaler:
    def __init__(self, *, values: MetricValues) -> None:
        self._values = values

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

    def read(self, *, namespace: str, scaler_metadata: Mapping[str, str]) -> Reading:
        trigger = self.trigger(scaler_metadata)
        found = self._values.external(metric=trigger.metric, namespace=namespace, selector=trigger.selector)
        if not found:
            age = self._values.max_value_age
            raise NotFound(
                f"external metric {trigger.metric} in namespace {namespace or '(none)'}"
                + (f" with labelSelector {trigger.selector}" if not trigger.selector.empty else "")
                + " has no value"
                + (f" newer than {age:g}s" if age > 0 else "")
                + ": an empty result is not taken as 0; check the series in Prometheus"
            )
        total = math.fsum(v.value for v in found)
        if not math.isfinite(total):
            raise UpstreamUnavailable(
                f"external metric {trigger.metric} in namespace {namespace or '(none)'} is {total}, "
                "not a number KEDA can scale on; check the metric's query"
            )
        return Reading(trigger, total)
