"""Metric families → exposition bytes, rendered once per collection so that a scrape is a lookup.

A :class:`Page` holds one collection's body in Prometheus text format 0.0.4 and in OpenMetrics 1.0,
each also as a gzip stream compressed up to a sync point. The only work left per scrape is the
snapshot-age sample (its value changes every second), which is appended to the plain body or fed
through a copy of the paused gzip compressor, so every response is one valid gzip member.

Types: DCGM counters keep their names without ``_total`` (dcgm-exporter's contract). Text 0.0.4
declares them ``counter`` exactly as dcgm-exporter does; OpenMetrics requires counter samples to end
in ``_total``, so there those families are declared ``unknown`` and the names stay identical.
Counters that already end in ``_total`` are proper OpenMetrics counters.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from exporter.exposition import Family, LabelPairs

TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"

AGE_NAME = "gpupilot_exporter_snapshot_age_seconds"
AGE_HELP = (
    "Seconds since the cached snapshot served here was collected; it grows while the backend is down or hung."
)

_GZIP_WBITS = 31  # zlib's gzip container


def escape_label_value(value: str) -> str:
    """Label values: backslash, double quote and newline escaped (both formats)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help_text(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_help_openmetrics(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def format_value(value: float) -> str:
    """Plain numbers: integral values without a fraction, others as the shortest round-trip repr."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


def format_labels(labels: LabelPairs) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{escape_label_value(v)}"' for k, v in labels)
    return "{" + inner + "}"


def _samples(name: str, fam: Family) -> Iterable[str]:
    for labels, value in fam.samples:
        yield f"{name}{format_labels(labels)} {format_value(value)}\n"


def render_text(families: Iterable[Family]) -> str:
    """Prometheus text format 0.0.4 (no trailing marker)."""
    out: list[str] = []
    for fam in families:
        kind = fam.kind if fam.kind in ("counter", "gauge") else "untyped"
        out.append(f"# HELP {fam.name} {_escape_help_text(fam.help)}\n")
        out.append(f"# TYPE {fam.name} {kind}\n")
        out.extend(_samples(fam.name, fam))
    return "".join(out)


def openmetrics_type(fam: Family) -> tuple[str, str]:
    """(family name, type) in OpenMetrics: ``_total`` counters stay counters, others are ``unknown``."""
    if fam.kind == "counter":
        if fam.name.endswith("_total"):
            return fam.name[: -len("_total")], "counter"
        return fam.name, "unknown"
    if fam.kind == "gauge":
        return fam.name, "gauge"
    return fam.name, "unknown"


def render_openmetrics(families: Iterable[Family]) -> str:
    """OpenMetrics 1.0 without the closing ``# EOF`` (added after the per-scrape age sample)."""
    out: list[str] = []
    for fam in families:
        om_name, kind = openmetrics_type(fam)
        out.append(f"# HELP {om_name} {_escape_help_openmetrics(fam.help)}\n")
        out.append(f"# TYPE {om_name} {kind}\n")
        out.extend(_samples(fam.name, fam))
    return "".join(out)


class _GzipPrefix:
    """A gzip stream paused at a sync point; :meth:`finish` appends a tail and closes it."""

    __slots__ = ("_compressor", "prefix")

    def __init__(self, body: bytes) -> None:
        self._compressor = zlib.compressobj(6, zlib.DEFLATED, _GZIP_WBITS)
        self.prefix = self._compressor.compress(body) + self._compressor.flush(zlib.Z_SYNC_FLUSH)

    def finish(self, tail: bytes) -> bytes:
        # copy() clones the deflate state (CRC and length included): ~15 µs, and thread-safe.
        c = self._compressor.copy()
        return self.prefix + c.compress(tail) + c.flush()


@dataclass(frozen=True)
class Page:
    """One collection's exposition. Immutable; replaced as a whole after each collection."""

    text: bytes
    openmetrics: bytes
    text_gzip: _GzipPrefix
    openmetrics_gzip: _GzipPrefix
    snapshot_at: float | None
    """``time.monotonic()`` when the served snapshot was collected; ``None`` before the first one."""
    age_prefix: str
    """``gpupilot_exporter_snapshot_age_seconds{…} `` — the sample line up to its value."""

    def tail(self, *, openmetrics: bool, now: float) -> bytes:
        """The per-scrape part: the age family (when a snapshot exists), plus ``# EOF`` for OpenMetrics."""
        parts = []
        if self.snapshot_at is not None:
            age = max(0.0, now - self.snapshot_at)
            help_text = _escape_help_openmetrics(AGE_HELP) if openmetrics else AGE_HELP
            parts.append(
                f"# HELP {AGE_NAME} {help_text}\n# TYPE {AGE_NAME} gauge\n{self.age_prefix}{age:.3f}\n"
            )
        if openmetrics:
            parts.append("# EOF\n")
        return "".join(parts).encode()

    def body(self, *, openmetrics: bool, gzip: bool, now: float) -> bytes:
        tail = self.tail(openmetrics=openmetrics, now=now)
        if gzip:
            return (self.openmetrics_gzip if openmetrics else self.text_gzip).finish(tail)
        return (self.openmetrics if openmetrics else self.text) + tail


def render_page(
    families: Sequence[Family], *, snapshot_at: float | None, age_labels: LabelPairs = ()
) -> Page:
    """Render every family once, in both formats, plain and gzip."""
    text = render_text(families).encode()
    om = render_openmetrics(families).encode()
    return Page(
        text=text,
        openmetrics=om,
        text_gzip=_GzipPrefix(text),
        openmetrics_gzip=_GzipPrefix(om),
        snapshot_at=snapshot_at,
        age_prefix=f"{AGE_NAME}{format_labels(age_labels)} ",
    )
