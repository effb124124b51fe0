"""``argparse`` ``type=`` callables for every gpupilot command: one way to read each kind of flag.

Each turns the flag's text into a value or raises :class:`argparse.ArgumentTypeError`, which
argparse prints as one line (``prog: error: argument --flag: …``) before exiting with status 2.
Numbers in a range come from :mod:`gpupilot_common.numbers` (``real``, ``whole``, ``bounded``),
base URLs from :func:`gpupilot_common.urls.base_url`, files that must exist from
:func:`gpupilot_common.cli.existing_file`; they are re-exported here so a command imports one module.
"""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Callable

from gpupilot_common import timefmt
from gpupilot_common.cli import existing_file
from gpupilot_common.numbers import bounded, real, whole
from gpupilot_common.urls import base_url

__all__ = [
    "base_url",
    "bounded",
    "cluster_name",
    "csv_list",
    "duration",
    "existing_file",
    "label_name",
    "listen_address",
    "moment",
    "namespaced_name",
    "real",
    "whole",
]


def duration(
    *, minimum: float = 0.0, maximum: float = timefmt.TEN_YEARS, allow_zero: bool = False
) -> Callable[[str], float]:
    """Seconds in Prometheus' duration grammar (``90``, ``30s``, ``1h30m``, ``7d``), finite, more
    than zero (or zero with ``allow_zero``) and within ``[minimum, maximum]``."""

    def parse(text: str) -> float:
        try:
            return timefmt.parse_duration(text, minimum=minimum, maximum=maximum, allow_zero=allow_zero)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = "duration"
    return parse


def moment(text: str) -> float:
    """Unix seconds from RFC 3339 / ISO 8601 (``2026-11-29T12:00:00Z``; no zone means UTC), Unix
    seconds, ``now`` or ``now-7d`` (relative to when the flag is read)."""
    try:
        return timefmt.parse_time(text, now=time.time())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def csv_list(text: str) -> tuple[str, ...]:
    """``a, b,,c`` → ``("a", "b", "c")``: comma-separated, blanks dropped."""
    return tuple(p.strip() for p in text.split(",") if p.strip())


LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def label_name(text: str) -> str:
    """A Prometheus label name a user may set (not reserved: no leading ``__``)."""
    if not LABEL_NAME.fullmatch(text) or text.startswith("__"):
        raise argparse.ArgumentTypeError(
            f"{text[:60]!r} is not a Prometheus label name (letters, digits, '_'; not starting with a digit or '__')"
        )
    return text


def cluster_name(text: str) -> str:
    """A cluster's name as its Prometheus label value: 1-253 printable characters."""
    if not text or len(text) > 253 or not text.isprintable():
        raise argparse.ArgumentTypeError(f"{text[:60]!r} is not a cluster name (1-253 printable characters)")
    return text


def namespaced_name(*, kind: str, example: str) -> Callable[[str], tuple[str, str]]:
    """``NAMESPACE/NAME`` of a ``kind`` (``SERVICE``, ``SECRET``) → ``(namespace, name)``."""

    def parse(text: str) -> tuple[str, str]:
        namespace, sep, name = text.partition("/")
        if not sep or not namespace or not name or "/" in name:
            raise argparse.ArgumentTypeError(f"{text[:60]!r}: expected NAMESPACE/{kind}, e.g. {example}")
        return namespace, name

    parse.__name__ = f"NAMESPACE/{kind}"
    return parse


_PORT = re.compile(r"[0-9]{1,5}")


def listen_address(text: str) -> tuple[str, int]:
    """``HOST:PORT``, ``[IPv6]:PORT`` or ``:PORT`` (every interface) → ``(host, port)``.

    Port 0 is accepted: the system picks a free port and the server says which one it got (tests
    and side-by-side runs use it). Anything above 65535, signs, spaces and non-ASCII digits are not.
    """
    host, sep, port = text.rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]") and len(host) > 2
    if (
        not sep
        or not _PORT.fullmatch(port)
        or int(port) > 65535
        or (":" in host and not bracketed)  # an IPv6 address goes in brackets: [::1]:9400
        or (host.startswith("[") != host.endswith("]"))
        or any(c.isspace() for c in host)
    ):
        raise argparse.ArgumentTypeError(
            f"{text[:60]!r}: expected HOST:PORT, [IPv6]:PORT or :PORT with a port 0-65535, "
            "e.g. :9400 or 127.0.0.1:9400"
        )
    return (host[1:-1] if bracketed else host), int(port)
