"""A trigger's ``scalerMetadata`` → :class:`Trigger`, checked once per request.

KEDA passes the ScaledObject trigger's ``metadata`` map as is (every value a string); each bad
field becomes one :class:`~adapter.errors.BadRequest` naming the field and what to write, which the
gRPC server returns as INVALID_ARGUMENT (KEDA shows it in the ScaledObject's events).

* A field may come as ``<field>FromEnv``: KEDA reads the named variable of the scaled workload's
  container and passes its value under that same key.
* Numbers are read as KEDA and Go read them (``strconv.ParseFloat``): ASCII digits, one ``.``, an
  exponent (``1e3``), or a hexadecimal float (``0x1p4``, where ``_`` may separate digits); no
  spaces, no ``_`` in decimal numbers, no other digits. ``targetValue`` must be > 0 and at least
  0.001 (KEDA hands it to the HPA in milli-units, truncated: 0.0004 would become 0), and every
  value at most 9.2e15 in magnitude (KEDA multiplies by 1000 into an int64).
* PEM material (``caCert``, ``tlsClientCert``, ``tlsClientKey``, or any value holding
  ``-----BEGIN``) is refused without echoing it: KEDA reads those only from a
  TriggerAuthentication; found in a trigger's metadata they mean KEDA connected in plaintext and
  sent a certificate or private key in the clear.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import NamedTuple

from adapter.errors import BadRequest
from adapter.provider.selectors import Selector, parse_selector
from adapter.provider.valuecheck import QUANTITY_MAX

METRIC = "metric"
LABEL_SELECTOR = "labelSelector"
TARGET_VALUE = "targetValue"
ACTIVATION_VALUE = "activationValue"
KNOWN = frozenset({METRIC, LABEL_SELECTOR, TARGET_VALUE, ACTIVATION_VALUE})
"""The fields read here (each also as ``<field>FromEnv``); KEDA adds ``scalerAddress`` and users may
add others, which are ignored (TLS material excepted: see the module's docstring)."""

_MAX_TEXT = 64
FROM_ENV = "FromEnv"

TLS_KEYS = ("caCert", "tlsClientCert", "tlsClientKey")
"""What KEDA reads from a TriggerAuthentication only (``AuthParams``)."""
PEM_MARK = "-----BEGIN"

_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)
_HEX = re.compile(
    r"[+-]?0[xX](?:_?[0-9a-fA-F])*(?:\.[0-9a-fA-F]*)?[pP][+-]?[0-9]+", re.ASCII
)  # Go: underscores only between digits (or after the base prefix), the p exponent required
_NON_FINITE = re.compile(r"[+-]?(?:inf|infinity|nan)", re.IGNORECASE)


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


def refuse_pem(metadata: Mapping[str, str]) -> None:
    """Refuse TLS material sent as trigger metadata, naming the key, never the value."""
    for key, value in metadata.items():
        if key.removesuffix(FROM_ENV) in TLS_KEYS or PEM_MARK in value:
            raise BadRequest(
                f"scalerMetadata.{shown(key)[1:-1]} holds TLS material (a certificate or private key; not shown): "
                "KEDA reads caCert, tlsClientCert and tlsClientKey only from a TriggerAuthentication "
                "(authenticationRef); in the trigger's metadata they are sent in the clear and KEDA "
                "connects without TLS. Move them to a TriggerAuthentication's secretTargetRef and "
                "rotate the key that was sent"
            )


def field(metadata: Mapping[str, str], name: str) -> tuple[str, str | None]:
    """``(key, value)`` of ``name`` or of ``nameFromEnv`` (KEDA's resolved variable)."""
    env = name + FROM_ENV
    if name in metadata and env in metadata:
        raise BadRequest(f"scalerMetadata: give {name} or {env}, not both")
    key = env if env in metadata else name
    return key, metadata.get(key)


def parse_float(text: str) -> float:
    """A number as Go's ``strconv.ParseFloat`` reads it (finite values only); ValueError otherwise."""
    if _DECIMAL.fullmatch(text):
        return float(text)
    if _HEX.fullmatch(text):
        return float.fromhex(text.replace("_", ""))
    raise ValueError(text)


def _number(metadata: Mapping[str, str], name: str, *, default: float | None, target: bool) -> float:
    key, text = field(metadata, name)
    if text is None or text == "":
        if default is None:
            raise BadRequest(
                f"scalerMetadata.{key} is required: the value per replica to scale to, e.g. '50'"
            )
        return default
    if _NON_FINITE.fullmatch(text):
        raise BadRequest(f"scalerMetadata.{key} {shown(text)}: must be a finite number")
    try:
        value = parse_float(text)
    except ValueError:
        raise BadRequest(
            f"scalerMetadata.{key} {shown(text)}: not a number as KEDA reads it: ASCII digits with an "
            "optional '.' and exponent (e.g. 50, 0.5, 2e3), without spaces or '_'"
        ) from None
    if not math.isfinite(value) or abs(value) > QUANTITY_MAX:
        raise BadRequest(
            f"scalerMetadata.{key} {shown(text)}: must be at most 9.2e15 in magnitude "
            "(KEDA multiplies it by 1000 into a 64-bit integer)"
        )
    if target and value <= 0:
        raise BadRequest(f"scalerMetadata.{key} {shown(text)}: must be greater than 0")
    if target and int(value * 1000) < 1:
        raise BadRequest(
            f"scalerMetadata.{key} {shown(text)}: must be at least 0.001 (KEDA gives the HPA its target "
            "in thousandths, truncated: this one would be 0)"
        )
    return value


def parse(metadata: Mapping[str, str]) -> Trigger:
    refuse_pem(metadata)
    metric = (field(metadata, METRIC)[1] or "").strip()
    if not metric:
        raise BadRequest(
            "scalerMetadata.metric is required: the name of an external metric in the adapter's config"
        )
    selector_key, selector_text = field(metadata, LABEL_SELECTOR)
    try:
        selector = parse_selector(selector_text)
    except BadRequest as exc:
        raise BadRequest(f"scalerMetadata.{selector_key}: {exc}") from None
    return Trigger(
        metric=metric,
        selector=selector,
        target=_number(metadata, TARGET_VALUE, default=None, target=True),
        activation=_number(metadata, ACTIVATION_VALUE, default=0.0, target=False),
    )
