"""mig-parted configs (``version: v1``): the spec, parsed in full, and the writer.

Parsing follows mig-parted's ``api/spec/v1``: ``device-filter`` is a string or a list of strings
``0xDDDD10DE`` or ``0xDDDD10DE:0xSSSSVVVV`` (with a subsystem id); ``devices`` is ``all`` or a list of
GPU indices (``[]`` selects no GPU); ``mig-enabled: false`` carries no ``mig-devices`` (not even a 0
count); ``mig-enabled: true`` needs ``mig-devices`` (``{}`` = MIG on, no instances) whose counts are
not all 0; profile names are ``[Nc.]Mg.XXgb[+me|-me|+me.all|+gfx]``. Every structural problem becomes
an :class:`Issue` (collected, not raised). Loading files is :mod:`rightsizer.migparted.manifest`;
deciding which device an entry fits is :mod:`rightsizer.migparted.applicability`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import yaml

from mig_geometry.catalogue import NVIDIA_VENDOR_ID, parse_name
from rightsizer.errors import InputError

ENTRY_FIELDS = ("devices", "device-filter", "mig-enabled", "mig-devices")
TOP_FIELDS = ("version", "mig-configs")
MAX_COUNT = 64
"""No GPU holds more than 7 instances (×8 compute instances); larger counts are refused at parse time."""
_FILTER = re.compile(r"^0[xX]([0-9a-fA-F]{1,8})(?::0[xX]([0-9a-fA-F]{1,8}))?$")


class MigPartedError(InputError, ValueError):
    """A file that cannot be read or parsed as YAML; one line, with the line number where known."""


@dataclass(frozen=True)
class MigEntry:
    """One entry of a named config: which GPUs, MIG on or off, and the instances to create."""

    devices: Literal["all"] | tuple[int, ...]
    mig_enabled: bool
    mig_devices: Mapping[str, int] = field(default_factory=dict)
    device_filter: tuple[int, ...] = ()
    """16-bit PCI device ids (``0x2330``) the entry is restricted to; empty = any device."""
    subsystem_filter: tuple[int | None, ...] = ()
    """Per ``device_filter`` item, the 32-bit subsystem id it also requires (empty = none do)."""

    def filters(self) -> list[tuple[int, int | None]]:
        subs = self.subsystem_filter or (None,) * len(self.device_filter)
        return list(zip(self.device_filter, subs, strict=True))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"devices": "all" if self.devices == "all" else list(self.devices)}
        if self.device_filter:
            filters = [
                f"0x{d:04X}{NVIDIA_VENDOR_ID:04X}" + (f":0x{s:08X}" if s is not None else "")
                for d, s in self.filters()
            ]
            out["device-filter"] = filters[0] if len(filters) == 1 else filters
        out["mig-enabled"] = self.mig_enabled
        if self.mig_enabled:
            out["mig-devices"] = dict(sorted(self.mig_devices.items(), key=_profile_sort_key))
        return out


def shown(name: str, *, limit: int = 80) -> str:
    """A name from the file as it may be printed on one line: as is when printable and short, else
    its ``repr`` cut to ``limit`` (a key holding a newline or a megabyte must not break the output)."""
    if name.isprintable() and len(name) <= limit:
        return name
    text = repr(name)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class Issue:
    """One problem, formatted by :meth:`line` as ``FILE: config NAME entry I (device …): REASON``."""

    source: str
    config: str
    entry: int | None
    reason: str
    device_id: int | None = None
    model: str = ""

    def line(self) -> str:
        where = ""
        if self.config:
            where += f" config {shown(self.config)}"
        if self.entry is not None:
            where += f" entry {self.entry}"
        if self.device_id is not None:
            where += f" (device 0x{self.device_id:04x} {self.model})"
        if where:
            return f"{self.source}:{where}: {self.reason}"
        return f"{self.source}: {self.reason}"


@dataclass(frozen=True)
class MigPartedConfig:
    """A parsed mig-parted document: config name → entries, and what was wrong structurally."""

    source: str
    configs: Mapping[str, tuple[MigEntry, ...]]
    issues: tuple[Issue, ...] = ()
    raw: Mapping[str, Any] = field(default_factory=dict)
    """``mig-configs`` as written (to hand a config on unchanged)."""


def _broken(source: str, reason: str) -> MigPartedConfig:
    return MigPartedConfig(source, {}, (Issue(source, "", None, reason),))


def parse_document(doc: object, *, source: str) -> MigPartedConfig:
    """Structure of one mig-parted document; problems become :class:`Issue`\\ s, not exceptions."""
    issues: list[Issue] = []
    if not isinstance(doc, dict):
        return _broken(source, f"expected a mapping with {', '.join(TOP_FIELDS)}, got {type(doc).__name__}")
    for key in doc:
        if key not in TOP_FIELDS:
            issues.append(
                Issue(source, "", None, f"unknown field {_short(key)} (allowed: {', '.join(TOP_FIELDS)})")
            )
    version = doc.get("version")
    if version != "v1":
        issues.append(Issue(source, "", None, f"version must be v1, got {_short(version)}"))
    raw_configs = doc.get("mig-configs")
    if not isinstance(raw_configs, dict) or not raw_configs:
        issues.append(Issue(source, "", None, "mig-configs must be a non-empty mapping of name → entries"))
        return MigPartedConfig(source, {}, tuple(issues))
    configs: dict[str, tuple[MigEntry, ...]] = {}
    for name, raw_entries in raw_configs.items():
        cname = str(name) if isinstance(name, (str, int)) else _short(name)
        if not isinstance(raw_entries, list) or not raw_entries:
            issues.append(Issue(source, cname, None, "must be a non-empty list of entries"))
            continue
        entries = []
        for i, raw in enumerate(raw_entries):
            entry = _parse_entry(raw, source=source, config=cname, index=i, issues=issues)
            if entry is not None:
                entries.append(entry)
        configs[cname] = tuple(entries)
    return MigPartedConfig(source, configs, tuple(issues), raw=raw_configs)


def _parse_entry(
    raw: object, *, source: str, config: str, index: int, issues: list[Issue]
) -> MigEntry | None:
    def bad(reason: str) -> None:
        issues.append(Issue(source, config, index, reason))

    if not isinstance(raw, dict):
        bad(f"entry must be a mapping with {', '.join(ENTRY_FIELDS)}")
        return None
    before = len(issues)
    for key in raw:
        if key not in ENTRY_FIELDS:
            bad(f"unknown field {_short(key)} (allowed: {', '.join(ENTRY_FIELDS)})")
    devices = _parse_devices(raw, bad)
    filters = _parse_filter(raw.get("device-filter"), bad) if "device-filter" in raw else []
    enabled = _parse_enabled(raw, bad)
    mig = _parse_mig_devices(raw.get("mig-devices"), enabled=enabled, bad=bad)
    if len(issues) != before:
        return None
    return MigEntry(
        devices=devices,
        mig_enabled=enabled,
        mig_devices=mig,
        device_filter=tuple(d for d, _ in filters),
        subsystem_filter=tuple(s for _, s in filters) if any(s is not None for _, s in filters) else (),
    )


def _parse_devices(raw: dict[Any, Any], bad: Callable[[str], None]) -> Literal["all"] | tuple[int, ...]:
    raw_devices = raw.get("devices")
    if raw_devices == "all":
        return "all"
    if isinstance(raw_devices, list) and all(_is_index(d) for d in raw_devices):
        devices = tuple(int(d) for d in raw_devices)
        if len(set(devices)) != len(devices):
            bad(f"devices lists a GPU index twice: {_short(raw_devices)}")
        return devices
    if "devices" not in raw:
        bad("devices is required: 'all' or a list of GPU indices like [0, 1]")
    else:
        bad(f"devices must be 'all' or a list of GPU indices like [0, 1], got {_short(raw_devices)}")
    return "all"


def _parse_enabled(raw: dict[Any, Any], bad: Callable[[str], None]) -> bool:
    enabled = raw.get("mig-enabled")
    if "mig-enabled" not in raw:
        bad("mig-enabled is required: true or false")
        return False
    if not isinstance(enabled, bool):
        bad(f"mig-enabled must be true or false, got {_short(enabled)}")
        return False
    return enabled


def _parse_mig_devices(raw_mig: object, *, enabled: bool, bad: Callable[[str], None]) -> dict[str, int]:
    mig: dict[str, int] = {}
    if raw_mig is None:
        if enabled:
            bad("mig-devices is required when mig-enabled is true (use {} for MIG on without instances)")
        return mig
    if not isinstance(raw_mig, dict):
        bad(f"mig-devices must be a mapping of profile → count, got {_short(raw_mig)}")
        return mig
    for name, count in raw_mig.items():
        if not isinstance(name, str) or parse_name(name) is None:
            bad(f"mig-devices {_short(name)}: not a MIG profile name like 1g.10gb, 1c.3g.40gb or 1g.24gb+gfx")
        elif not isinstance(count, int) or isinstance(count, bool) or not 0 <= count <= MAX_COUNT:
            bad(f"mig-devices {name}: count must be an integer from 0 to {MAX_COUNT}, got {_short(count)}")
        else:
            mig[name] = count
    if not enabled and raw_mig:
        bad(
            "mig-enabled is false but mig-devices is not empty (even a 0 count is refused); "
            "disabled entries carry no devices"
        )
    if enabled and mig and not any(mig.values()):
        bad("every mig-devices count is 0; use mig-devices: {} for MIG on without instances")
    return mig


def _short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _is_index(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1024


def _parse_filter(raw: object, bad: Callable[[str], None]) -> list[tuple[int, int | None]]:
    """mig-parted's ``device-filter``: a string or list of strings ``0xDDDDVVVV[:0xSSSSVVVV]``."""
    items = raw if isinstance(raw, list) else [raw]
    if not items:
        bad("device-filter is an empty list; leave it out to match every GPU")
    out: list[tuple[int, int | None]] = []
    for item in items:
        if not isinstance(item, str):
            bad(
                f'device-filter {_short(item)} must be a quoted string like "0x233010DE" '
                "(mig-parted refuses a YAML number)"
            )
            continue
        m = _FILTER.match(item.strip())
        if not m:
            bad(f"device-filter {item!r} is not of the form 0xDDDD10DE or 0xDDDD10DE:0xSSSS10DE")
            continue
        value = int(m.group(1), 16)
        sub = int(m.group(2), 16) if m.group(2) else None
        if value <= 0xFFFF:
            bad(
                f"device-filter {item!r} is read by mig-parted as vendor 0x{value:04X} and never matches; "
                f'write the device id with NVIDIA\'s vendor: "0x{value:04X}10DE"'
            )
            continue
        if value & 0xFFFF != NVIDIA_VENDOR_ID:
            bad(f"device-filter {item!r}: vendor must be 10DE (NVIDIA), form 0xDDDD10DE")
            continue
        out.append((value >> 16, sub))
    return out


# ---------------------------------------------------------------------------------------------- writing


def _profile_sort_key(item: tuple[str, int]) -> tuple[int, str]:
    name = item[0]
    head = name.split("g.", 1)[0]
    return (-int(head) if head.isdigit() else 0, name)


def document(configs: Mapping[str, Sequence[MigEntry]]) -> dict[str, Any]:
    """A mig-parted document: configs sorted by name, each entry's keys in mig-parted's order."""
    return {
        "version": "v1",
        "mig-configs": {name: [e.to_dict() for e in configs[name]] for name in sorted(configs)},
    }


def dump(configs: Mapping[str, Sequence[MigEntry]]) -> str:
    """YAML text of :func:`document`, stable from run to run."""
    return yaml.safe_dump(document(configs), sort_keys=False, default_flow_style=False)


def entries_for_layouts(
    layouts: Sequence[tuple[int, bool, Mapping[str, int]]], *, device_id: int | None = None
) -> list[MigEntry]:
    """Entries for per-GPU layouts ``(index, mig_enabled, mig_devices)``, grouping identical GPUs.

    Every GPU index is listed explicitly, so a node's config never touches GPUs it does not name.
    """
    groups: dict[tuple[bool, tuple[tuple[str, int], ...]], list[int]] = {}
    for index, enabled, devices in sorted(layouts, key=lambda t: t[0]):
        key = (enabled, tuple(sorted((n, c) for n, c in devices.items() if c)) if enabled else ())
        groups.setdefault(key, []).append(index)
    filt = (device_id,) if device_id is not None else ()
    entries = [
        MigEntry(devices=tuple(idx), mig_enabled=enabled, mig_devices=dict(devs), device_filter=filt)
        for (enabled, devs), idx in groups.items()
    ]
    entries.sort(key=lambda e: e.devices if isinstance(e.devices, tuple) else ())
    return entries
