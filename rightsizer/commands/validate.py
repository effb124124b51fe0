"""``gpupilot-rightsizer validate FILE``: check mig-parted configs against the geometry catalogue."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from mig_geometry.catalogue import by_device_id
from rightsizer.migparted import config as migparted
from rightsizer.migparted import timeslicing


def _device_id(text: str) -> int:
    try:
        value = int(text, 16)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a PCI device id like 0x2330") from None
    if value > 0xFFFF:
        value >>= 16
    if by_device_id(value) is None:
        raise argparse.ArgumentTypeError(f"device id 0x{value:04x} is not in the geometry catalogue")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Check mig-parted configs (bare, or in a ConfigMap under data.config.yaml; several YAML "
        "documents allowed) against the MIG geometry catalogue: fields, profile names, counts and "
        "whether a placement exists. Device-plugin time-slicing configs in the file are checked too. "
        "Exit 0 when valid, 1 with one line per error."
    )
    parser.add_argument("file", type=Path, metavar="FILE", help="YAML file with mig-parted config(s)")
    parser.add_argument(
        "--device-id",
        type=_device_id,
        default=None,
        metavar="ID",
        help=(
            "PCI device id to check against, e.g. 0x2330 or 0x233010DE. Without it, entries with a "
            "device-filter are checked against the filter's devices and entries without one against "
            "H100 80GB (0x2330). With it, every entry is checked against this device, and entries "
            "whose device-filter excludes it are skipped."
        ),
    )


def run(args: argparse.Namespace) -> int:
    path: Path = args.file
    try:
        text = migparted.read_text(path)
        docs = migparted.load_text(text, source=str(path), allow_none=True)
        sharing = timeslicing.find_in_text(text, source=str(path))
    except migparted.MigPartedError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except yaml.YAMLError as exc:  # pragma: no cover - load_text reports YAML errors first
        print(f"error: {path}: invalid YAML: {exc}", file=sys.stderr)
        return 1
    if not docs and not sharing:
        print(
            f"error: {path}: no mig-parted config found (expected 'version: v1' and 'mig-configs', "
            "bare or under a ConfigMap's data.config.yaml)",
            file=sys.stderr,
        )
        return 1
    result = migparted.validate(docs, device_id=args.device_id)
    lines = [issue.line() for issue in result.issues]
    for cfg in sharing:
        lines += timeslicing.check(cfg)
    for line in lines:
        print(line, file=sys.stderr)
    if lines:
        print(f"{path}: {len(lines)} error(s)", file=sys.stderr)
        return 1
    device = (
        f"0x{args.device_id:04x} {by_device_id(args.device_id).key}"  # type: ignore[union-attr]
        if args.device_id is not None
        else "their device-filter, else 0x2330 H100 80GB"
    )
    parts = []
    if docs:
        part = f"{result.configs} mig-parted config(s), {result.entries_checked} entry(ies) checked against {device}"
        if result.entries_skipped:
            part += f", {result.entries_skipped} skipped (device-filter excludes it)"
        parts.append(part)
    if sharing:
        parts.append(f"{len(sharing)} time-slicing config(s)")
    print(f"{path}: OK: {'; '.join(parts)}")
    return 0
