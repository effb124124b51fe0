"""Log lines of every service: ``--log-format text|json`` and ``--log-level``, one place.

``text`` (the default) is one line per record, ``TIME LEVEL LOGGER: message`` followed by the
record's structured fields as ``key=value``; ``json`` is one JSON object per line for log
collectors (Loki, Elasticsearch, CloudWatch)::

    {"time": "2026-12-07T06:00:00.123Z", "level": "info", "service": "rightsizer",
     "logger": "rightsizer.serve.scheduler", "msg": "report written to /var/lib/gpupilot/…",
     "path": "/var/lib/gpupilot/…"}

Structured fields come from ``log.info("…", extra=fields(path=str(p)))``: each is a key of the
JSON object and a ``key=value`` pair of the text line; values are strings, numbers or booleans
(anything else is written as its ``str``, never a Python repr). A logged exception is an ``error``
field (its type and message) and, in JSON, a ``traceback`` field; text lines are followed by the
traceback, as Python's logging writes it.

The flags are added to the top-level parser with their defaults and to each subcommand with
``argparse.SUPPRESS`` defaults, so ``gpupilot-adapter --log-level debug serve`` and
``gpupilot-adapter serve --log-level debug`` (what a chart's ``args`` list gives) both work.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Mapping
from typing import Any, TextIO

FORMATS = ("text", "json")
LEVELS = ("debug", "info", "warning", "error")
FIELDS = "gpupilot_fields"
"""The LogRecord attribute :func:`fields` sets (``extra=fields(…)``)."""


def fields(**values: Any) -> dict[str, dict[str, Any]]:
    """``extra=`` for a log call: structured fields of the line."""
    return {FIELDS: values}


def add_flags(parser: argparse.ArgumentParser, *, top_level: bool = True) -> None:
    """``--log-format`` and ``--log-level`` (and ``-v``, the older spelling of debug). Not at the top
    level: defaults suppressed, so a subcommand's parser does not overwrite the top level's."""

    def default(value: Any) -> Any:
        return value if top_level else argparse.SUPPRESS

    parser.add_argument(
        "--log-format",
        choices=FORMATS,
        default=default("text"),
        help="log lines on stderr: text (one line each, default) or json (one JSON object each)",
    )
    parser.add_argument(
        "--log-level",
        choices=LEVELS,
        default=default("info"),
        help="the least severe level logged (default info)",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=default(False),
        help="as --log-level debug",
    )


def level_of(args: argparse.Namespace) -> str:
    """The level the flags ask for (``-v`` means debug)."""
    return "debug" if getattr(args, "verbose", False) else str(getattr(args, "log_level", "info"))


def _value(v: Any) -> Any:
    if v is None or isinstance(v, bool | int | float | str):
        return v
    if isinstance(v, tuple | list | set | frozenset):
        return ",".join(str(x) for x in v)
    return str(v)


def _error(record: logging.LogRecord) -> str | None:
    if not record.exc_info or record.exc_info[1] is None:
        return None
    exc = record.exc_info[1]
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _stamp(record: logging.LogRecord) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"


class JsonFormatter(logging.Formatter):
    """One JSON object per record (see the module docstring)."""

    def __init__(self, *, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": _stamp(record),
            "level": record.levelname.lower(),
            "service": self.service,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        extra: Mapping[str, Any] = getattr(record, FIELDS, None) or {}
        for key, value in extra.items():
            if key not in out:
                out[key] = _value(value)
        if (error := _error(record)) is not None and record.exc_info is not None:
            out["error"] = error
            out["traceback"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, separators=(",", ":"))


def _pair(key: str, value: Any) -> str:
    text = "" if value is None else str(_value(value))
    if not text or any(c.isspace() or c in '"=' for c in text):
        text = json.dumps(text, ensure_ascii=False)
    return f"{key}={text}"


class TextFormatter(logging.Formatter):
    """``TIME LEVEL LOGGER: message key=value …`` on one line."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        saved = record.exc_info, record.exc_text
        record.exc_info, record.exc_text = None, None
        try:
            line = super().format(record)
        finally:
            record.exc_info, record.exc_text = saved
        extra: Mapping[str, Any] = getattr(record, FIELDS, None) or {}
        line = " ".join([line, *(_pair(k, v) for k, v in extra.items())])
        if record.exc_info and record.exc_info[1] is not None:
            line += "\n" + self.formatException(record.exc_info)
        return line


def configure(
    *,
    service: str,
    log_format: str = "text",
    level: str = "info",
    stream: TextIO | None = None,
    force: bool = False,
) -> None:
    """One handler on the root logger, on ``stream`` (stderr) in ``log_format``. As
    ``logging.basicConfig``, nothing happens when the root logger has handlers already (a host that
    configured logging, such as a test runner calling a command in its own process) unless ``force``."""
    if log_format not in FORMATS:
        raise ValueError(f"log format {log_format!r}: one of {', '.join(FORMATS)}")
    if level not in LEVELS:
        raise ValueError(f"log level {level!r}: one of {', '.join(LEVELS)}")
    root = logging.getLogger()
    if root.handlers and not force:
        return
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter(service=service) if log_format == "json" else TextFormatter())
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())


def peer(address: Any) -> str:
    """A socket peer as ``host:port`` (``[v6]:port``), not a tuple's repr; ``-`` when unknown."""
    if isinstance(address, tuple | list) and len(address) >= 2:
        host, port = address[0], address[1]
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return "-" if address is None else str(address)
