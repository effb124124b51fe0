"""A trigger's ``scalerMetadata`` → :class:`Trigger`, checked once per request.

KEDA passes the ScaledObject trigger's ``metadata`` map as is (every value a string); each bad
field becomes one :class:`~adapter.errors.BadRequest` naming the field and what to write, which the
gRPC server returns as INVALID_ARGUMENT (KEDA shows it in the ScaledObject's events).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import NamedTuple

from adapter.errors import BadRequest
from adapter.provider.selectors import Selector, parse_selector

METRIC = "metric"
LABEL_SELECTOR = "labelSelector"
TARGET_VALUE = "targetValue"
ACTIVATION_VALUE = "activationValue"
KNOWN = frozenset({METRIC, LABEL_SELECTOR, TARGET_VALUE, ACTIVATION_VALUE})
"""The fields read here; KEDA adds its own (``scalerAddress``, ``caCert``, ``tlsClientCert``,
``tlsClientKey``, ``unsafeSsl``) and users may add others, which are ignored."""

_MAX_TEXT = 64


class Trigger(NamedTuple):
    """What one trigger asks for. Hashable: answers are keyed by it."""

    metric: str
    selector: Selector
    target: float
    """``targetValue``: the HPA's AverageValue target per replica; finite and > 0."""
    activation: float
    """``activationValue``: the workload is active while the value is above it (KEDA scales from
    and to zero on this); finite, default 0."""


def shown(text: str) -> str:
    """``text`` quoted for a message, cut at 64 characters (a client may send any length)."""
    return repr(text if len(text) <= _MAX_TEXT else text[:_MAX_TEXT] + "…")


def _number(metadata: Mapping[str, str], field: str, *, default: float | None, positive: bool) -> float:
    text = metadata.get(field)
    if text is None or not text.strip():
        if default is None:
            raise BadRequest(
                f"scalerMetadata.{field} is required: the value per replica to scale to, e.g. '50'"
            )
        return default
    try:
        value = float(text)
    except ValueError:
        raise BadRequest(f"scalerMetadata.{field} {shown(text)}: not a number") from None
    if not math.isfinite(value):
        raise BadRequest(f"scalerMetadata.{field} {shown(text)}: must be a finite number")
    if positive and value <= 0:
        raise BadRequest(f"scalerMetadata.{field} {shown(text)}: must be greater than 0")
    return value


def parse(metadata: Mapping[str, str]) -> Trigger:
    metric = (metadata.get(METRIC) or "").strip()
    if not metric:
        raise BadRequest(
            "scalerMetadata.metric is required: the name of an external metric in the adapter's config"
        )
    try:
        selector = parse_selector(metadata.get(LABEL_SELECTOR))
    except BadRequest as exc:
        raise BadRequest(f"scalerMetadata.{LABEL_SELECTOR}: {exc}") from None
    return Trigger(
        metric=metric,
        selector=selector,
        target=_number(metadata, TARGET_VALUE, default=None, positive=True),
        activation=_number(metadata, ACTIVATION_VALUE, default=0.0, positive=False),
    )
