"""``-o table|wide|json|yaml`` for the commands people script: one flag, one way to print a document.

JSON and YAML print the same document (keys in a fixed order, numbers as numbers); each command's
reference page documents its schema. Exit codes never depend on the format."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from typing import Any, TextIO

import yaml

FORMATS = ("table", "wide", "json", "yaml")


def add_argument(parser: argparse.ArgumentParser, *, what: str = "the result") -> None:
    parser.add_argument(
        "-o",
        "--output",
        choices=FORMATS,
        default="table",
        help=f"how to print {what}: a table that fits the terminal, 'wide' (every column), or a JSON or "
        "YAML document (schema on the command's reference page) (default: table)",
    )


def structured(args: argparse.Namespace) -> bool:
    """Whether ``-o json`` or ``-o yaml`` was asked for (progress and notes then go to stderr)."""
    return getattr(args, "output", "table") in ("json", "yaml")


def emit(doc: Mapping[str, Any], fmt: str, out: TextIO | None = None) -> None:
    stream = out or sys.stdout
    if fmt == "json":
        stream.write(json.dumps(doc, indent=2, ensure_ascii=False, allow_nan=False) + "\n")
    else:
        stream.write(yaml.safe_dump(dict(doc), sort_keys=False, allow_unicode=True, width=1000))
