"""Metric families → exposition bytes, rendered once per collection so that a scrape is a lookup.

A :class:`Page` holds one collection's body in Prometheus text format 0.0.4 and in OpenMetrics 1.0,
each also as a gzip stream compressed up to a sync point. The only work left per scrape is the
snapshot-age sample (its value changes every second), which is appended to the plain body or fed
through a copy of the paused gzip compressor, so every response is one valid gzip member.

Types: DCGM counters keep their names without ``_total`` (dcgm-exporter's contract). Text 0.0.4
declares them ``counter`` exactly as dcgm-exporter does. OpenMetrics requires counter samples to end
in ``_total``, so a page holding such a counter says so (``openmetrics_safe`` is False) and the
server answers with the text format even when OpenMetrics is preferred, as dcgm-exporter (text
only) does: Prometheus then records them as counters with their names unchanged. The page's
OpenMetrics rendering, used when every counter ends in ``_total``, declares any other counter
``unknown``, never an invalid counter.
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from exporter.expose.exposition import Family, LabelPairs

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


def _sample_block(fam: Family, labels_cache: dict[LabelPairs, str]) -> str:
    """The family's sample lines; identical in both formats. ``labels_cache`` spares re-escaping a
    device's label set in each of the ~20 families it appears in."""
    out = []
    for labels, value in fam.samples:
        text = labels_cache.get(labels)
        if text is None:
            text = labels_cache[labels] = format_labels(labels)
        out.append(f"{fam.name}{text} {format_value(value)}\n")
    return "".join(out)


def _text_header(fam: Family) -> str:
    kind = fam.kind if fam.kind in ("counter", "gauge") else "untyped"
    return f"# HELP {fam.name} {_escape_help_text(fam.help)}\n# TYPE {fam.name} {kind}\n"


def _openmetrics_header(fam: Family) -> str:
    om_name, kind = openmetrics_type(fam)
    return f"# HELP {om_name} {_escape_help_openmetrics(fam.help)}\n# TYPE {om_name} {kind}\n"


def render_text(families: Iterable[Family]) -> str:
    """Prometheus text format 0.0.4 (no trailing marker)."""
    cache: dict[LabelPairs, str] = {}
    return "".join(_text_header(f) + _sample_block(f, cache) for f in families)


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
    cache: dict[LabelPairs, str] = {}
    return "".join(_openmetrics_header(f) + _sample_block(f, cache) for f in families)


_AGE_HEAD_TEXT = f"# HELP {AGE_NAME} {_escape_help_text(AGE_HELP)}\n# TYPE {AGE_NAME} gauge\n"
_AGE_HEAD_OPENMETRICS = f"# HELP {AGE_NAME} {_escape_help_openmetrics(AGE_HELP)}\n# TYPE {AGE_NAME} gauge\n"


class _GzipPrefix:
    """A gzip member compressed up to a byte-aligned sync point; :meth:`finish` closes it with a tail.

    The tail (the age sample, ~200 bytes) goes in as one final *stored* deflate block, and the gzip
    trailer's CRC-32 continues from the body's. So a scrape costs a CRC over the tail and one
    concatenation, not a compressor, and every response is one standard gzip member."""

    __slots__ = ("_crc", "_length", "prefix")

    def __init__(self, body: bytes) -> None:
        compressor = zlib.compressobj(6, zlib.DEFLATED, _GZIP_WBITS)
        # Z_SYNC_FLUSH ends on a byte boundary after a non-final block: a stored block can follow.
        self.prefix = compressor.compress(body) + compressor.flush(zlib.Z_SYNC_FLUSH)
        self._crc = zlib.crc32(body)
        self._length = len(body)

    def finish(self, tail: bytes) -> bytes:
        return b"".join(self.finish_parts(tail))

    def finish_parts(self, tail: bytes) -> tuple[bytes, bytes]:
        """The member as (the compressed prefix, the stored block with ``tail`` and the trailer)."""
        n = len(tail)
        if n > 0xFFFF:  # one stored block holds at most 65535 bytes; tails are a few hundred
            raise ValueError("gzip tail too long")
        block = struct.pack("<BHH", 1, n, n ^ 0xFFFF)  # BFINAL=1, BTYPE=00 (stored), LEN, NLEN
        trailer = struct.pack("<II", zlib.crc32(tail, self._crc), (self._length + n) & 0xFFFFFFFF)
        return self.prefix, block + tail + trailer


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
    openmetrics_safe: bool = True
    """False when a counter family's name lacks ``_total`` (DCGM's counters): OpenMetrics would
    have to rename it or drop its type, so serve the text format instead."""

    def negotiate(self, *, wants_openmetrics: bool) -> bool:
        """Whether to answer in OpenMetrics, given the client's preference."""
        return wants_openmetrics and self.openmetrics_safe

    def tail(self, *, openmetrics: bool, now: float) -> bytes:
        """The per-scrape part: the age family (when a snapshot exists), plus ``# EOF`` for OpenMetrics."""
        end = "# EOF\n" if openmetrics else ""
        if self.snapshot_at is None:
            return end.encode()
        age = max(0.0, now - self.snapshot_at)
        head = _AGE_HEAD_OPENMETRICS if openmetrics else _AGE_HEAD_TEXT
        return f"{head}{self.age_prefix}{age:.3f}\n{end}".encode()

    def body(self, *, openmetrics: bool, gzip: bool, now: float) -> bytes:
        return b"".join(self.parts(openmetrics=openmetrics, gzip=gzip, now=now))

    def parts(self, *, openmetrics: bool, gzip: bool, now: float) -> tuple[bytes, bytes]:
        """The body in two pieces, the pre-rendered one and the per-scrape one: a server joins them
        behind its response head in one copy (the text body is about 250 KiB on an 8-GPU node)."""
        tail = self.tail(openmetrics=openmetrics, now=now)
        if gzip:
            return (self.openmetrics_gzip if openmetrics else self.text_gzip).finish_parts(tail)
        return (self.openmetrics if openmetrics else self.text), tail


def render_page(
    families: Sequence[Family], *, snapshot_at: float | None, age_labels: LabelPairs = ()
) -> Page:
    """Render every family once, in both formats, plain and gzip."""
    cache: dict[LabelPairs, str] = {}
    blocks = [_sample_block(f, cache) for f in families]  # shared by both formats
    text = "".join(_text_header(f) + b for f, b in zip(families, blocks, strict=True)).encode()
    om = "".join(_openmetrics_header(f) + b for f, b in zip(families, blocks, strict=True)).encode()
    return Page(
        text=text,
        openmetrics=om,
        text_gzip=_GzipPrefix(text),
        openmetrics_gzip=_GzipPrefix(om),
        snapshot_at=snapshot_at,
        age_prefix=f"{AGE_NAME}{format_labels(age_labels)} ",
        openmetrics_safe=not any(f.kind == "counter" and not f.name.endswith("_total") for f in families),
    )
