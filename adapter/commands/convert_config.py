"""``gpupilot-adapter convert-config``: a prometheus-adapter config file in this adapter's format."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from adapter.config import convert
from adapter.config.mapping import parse_config
from gpupilot_common import atomicfile


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", type=Path, help="prometheus-adapter config file (its --config)")
    parser.add_argument(
        "-o", "--out", type=Path, help="write the converted config here (default: standard output)"
    )


def run(args: argparse.Namespace) -> int:
    path: Path = args.file
    conv = convert.convert(convert.load(path), source=str(path))
    doc = conv.document()
    for note in conv.notes:
        print(f"convert-config: {path}: {note}", file=sys.stderr)
    if not doc:
        print(f"convert-config: {path}: no rule could be converted", file=sys.stderr)
        return 1
    parse_config(doc, source=f"converted {path}")  # what is written loads
    text = (
        f"# Converted from the prometheus-adapter config {path.name} by gpupilot-adapter convert-config.\n"
        + yaml.safe_dump(doc, sort_keys=False, width=110)
    )
    if args.out:
        try:
            atomicfile.write_text(args.out, text)
        except atomicfile.WriteFailed as exc:
            print(f"convert-config: {exc}", file=sys.stderr)
            return 1
        print(
            f"wrote {args.out}: {len(conv.metrics)} metric(s), {len(conv.external)} external", file=sys.stderr
        )
    else:
        sys.stdout.write(text)
    return 0
