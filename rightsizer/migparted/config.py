"""mig-parted configs (``version: v1``): parse, validate against the geometry catalogue, write.

Accepted input: a bare mig-parted document, a Kubernetes ConfigMap carrying one under
``data["config.yaml"]`` (the MIG Manager's form, as in the seeds), or several of either in one
multi-document YAML file. Parsing collects every structural problem instead of stopping at the
first; :func:`validate` then checks each entry against the GPU models it applies to: profile known
for the device, count within the per-GPU maximum, and a disjoint placement existing
(:func:`mig_geometry.placement.place`), which is exactly "the MIG Manager can apply it".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from mig_geometry.catalogue import NVIDIA_VENDOR_ID, GpuModel, by_device_id
from mig_geometry.names import canonical_profile
from mig_geometry.placement import place
from rightsizer.errors import InputError

ENTRY_FIELDS = ("devices", "device-filter", "mig-enabled", "mig-devices")
TOP_FIELDS = ("version", "mig-configs")
DEFAULT_DEVICE_ID = 0x2330
"""H100 80GB HBM3 (SXM): what entries without a ``device-filter`` are checked against by default."""


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

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"devices": "all" if self.devices == "all" else list(self.devices)}
        if self.device_filter:
            filters = [f"0x{d:04X}{NVIDIA_VENDOR_ID:04X}" for d in self.device_filter]
            out["device-filter"] = filters[0] if len(filters) == 1 else filters
        out["mig-enabled"] = self.mig_enabled
        if self.mig_enabled:
            out["mig-devices"] = dict(sorted(self.mig_devices.items(), key=_profile_sort_key))
        return out


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
            where += f" config {self.config}"
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


# ---------------------------------------------------------------------------------------------- reading


def read_text(path: Path) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise MigPartedError(f"{path}: cannot read: {reason}") from exc


def load_file(path: Path) -> list[MigPartedConfig]:
    """Every mig-parted document in ``path`` (bare, ConfigMap-wrapped, multi-document)."""
    return load_text(read_text(path), source=str(path))


def load_text(text: str, *, source: str, allow_none: bool = False) -> list[MigPartedConfig]:
    """Parse every mig-parted document; ConfigMaps of other kinds (a device-plugin sharing config)
    are left out. No mig-parted config at all is an error unless ``allow_none``."""
    try:
        nodes = list(yaml.compose_all(text, Loader=yaml.SafeLoader))
        docs = list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        raise MigPartedError(_yaml_error(source, exc, offset=0)) from exc
    out: list[MigPartedConfig] = []
    for index, (doc, node) in enumerate(zip(docs, nodes, strict=True)):
        if doc is None:
            continue
        label = source if len(docs) == 1 else f"{source} document {index + 1}"
        if isinstance(doc, dict) and doc.get("kind") == "ConfigMap":
            if allow_none and not _has_mig_configs(doc):
                continue
            out.extend(_from_config_map(doc, node, source=label, file_source=source))
        else:
            out.append(parse_document(doc, source=label))
    if not out and not allow_none:
        raise MigPartedError(
            f"{source}: no mig-parted config found (expected 'version: v1' and 'mig-configs')"
        )
    return out


def _has_mig_configs(doc: Mapping[str, Any]) -> bool:
    data = doc.get("data")
    return isinstance(data, dict) and any(isinstance(v, str) and "mig-configs" in v for v in data.values())


def _yaml_error(source: str, exc: yaml.YAMLError, *, offset: int) -> str:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    if mark is not None:
        return f"{source}:{mark.line + 1 + offset}: invalid YAML: {problem}"
    return f"{source}: invalid YAML: {problem}"


def _from_config_map(
    doc: Mapping[str, Any], node: yaml.Node | None, *, source: str, file_source: str
) -> list[MigPartedConfig]:
    name = (doc.get("metadata") or {}).get("name", "?")
    data = doc.get("data")
    label = f"{source} (ConfigMap {name})"
    if not isinstance(data, dict) or not data:
        return [_broken(label, "ConfigMap has no data; the mig-parted config goes under data.config.yaml")]
    keys = [k for k, v in data.items() if isinstance(v, str) and "mig-configs" in v]
    if "config.yaml" in data and "config.yaml" not in keys:
        keys.insert(0, "config.yaml")
    if not keys:
        return [
            _broken(label, "no mig-parted config under data (expected data.config.yaml with mig-configs)")
        ]
    out = []
    for key in keys:
        text = data[key]
        if not isinstance(text, str):
            out.append(_broken(label, f"data.{key} must be a string holding the mig-parted YAML"))
            continue
        offset = _value_line(node, key)
        try:
            inner = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise MigPartedError(_yaml_error(file_source, exc, offset=offset)) from exc
        out.append(parse_document(inner, source=f"{label} data.{key}"))
    return out


def _value_line(node: yaml.Node | None, key: str) -> int:
    """Lines before the first line of a block scalar under ``data.<key>`` (0 if not found)."""
    if not isinstance(node, yaml.MappingNode):
        return 0
    for k, v in node.value:
        if k.value == "data" and isinstance(v, yaml.MappingNode):
            for dk, dv in v.value:
                if dk.value == key:
                    # A block scalar (|) starts on the line after its key.
                    return int(dv.start_mark.line) + (1 if dv.style in ("|", ">") else 0)
    return 0


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
                Issue(source, "", None, f"unknown field {key!r} (allowed: {', '.join(TOP_FIELDS)})")
            )
    version = doc.get("version")
    if version != "v1":
        issues.append(Issue(source, "", None, f"version must be v1, got {version!r}"))
    raw_configs = doc.get("mig-configs")
    if not isinstance(raw_configs, dict) or not raw_configs:
        issues.append(Issue(source, "", None, "mig-configs must be a non-empty mapping of name → entries"))
        return MigPartedConfig(source, {}, tuple(issues))
    configs: dict[str, tuple[MigEntry, ...]] = {}
    for name, raw_entries in raw_configs.items():
        cname = str(name)
        if not isinstance(raw_entries, list) or not raw_entries:
            issues.append(Issue(source, cname, None, "must be a non-empty list of entries"))
            continue
        entries = []
        for i, raw in enumerate(raw_entries):
            entry = _parse_entry(raw, source=source, config=cname, index=i, issues=issues)
            if entry is not None:
                entries.append(entry)
        configs[cname] = tuple(entries)
    return MigPartedConfig(source, configs, tuple(issues))


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
            bad(f"unknown field {key!r} (allowed: {', '.join(ENTRY_FIELDS)})")
    devices: Literal["all"] | tuple[int, ...] = "all"
    raw_devices = raw.get("devices")
    if raw_devices == "all":
        devices = "all"
    elif isinstance(raw_devices, list) and raw_devices and all(_is_index(d) for d in raw_devices):
        devices = tuple(int(d) for d in raw_devices)
        if len(set(devices)) != len(devices):
            bad(f"devices lists a GPU index twice: {raw_devices}")
    elif raw_devices is None:
        bad("devices is required: 'all' or a list of GPU indices like [0, 1]")
    else:
        bad(f"devices must be 'all' or a non-empty list of GPU indices, got {raw_devices!r}")
    filters = _parse_filter(raw.get("device-filter"), bad)
    enabled = raw.get("mig-enabled")
    if not isinstance(enabled, bool):
        bad(f"mig-enabled must be true or false, got {enabled!r}")
        enabled = False
    raw_mig = raw.get("mig-devices")
    mig: dict[str, int] = {}
    if raw_mig is None:
        if enabled:
            bad("mig-devices is required when mig-enabled is true (use {} for MIG on without instances)")
    elif not isinstance(raw_mig, dict):
        bad(f"mig-devices must be a mapping of profile → count, got {raw_mig!r}")
    else:
        for name, count in raw_mig.items():
            if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                bad(f"mig-devices {name}: count must be an integer >= 0, got {count!r}")
            else:
                mig[str(name)] = count
        if not enabled and any(mig.values()):
            bad("mig-enabled is false but mig-devices lists instances; disabled entries carry no devices")
    if len(issues) != before:
        return None
    return MigEntry(devices=devices, mig_enabled=bool(enabled), mig_devices=mig, device_filter=filters)


def _is_index(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _parse_filter(raw: object, bad: Any) -> tuple[int, ...]:
    if raw is None:
        return ()
    items = raw if isinstance(raw, list) else [raw]
    out = []
    for item in items:
        text = str(item).strip()
        try:
            value = int(text, 16)
        except ValueError:
            bad(f"device-filter {text!r} is not of the form 0xDDDD10DE")
            continue
        if value > 0xFFFF:
            if value & 0xFFFF != NVIDIA_VENDOR_ID:
                bad(f"device-filter {text!r}: vendor must be 10DE (NVIDIA), form 0xDDDD10DE")
                continue
            value >>= 16
        out.append(value)
    return tuple(out)


# ---------------------------------------------------------------------------------------------- checking


@dataclass(frozen=True)
class ValidationResult:
    issues: tuple[Issue, ...]
    configs: int
    entries_checked: int
    entries_skipped: int
    """Entries whose device-filter excludes the device chosen with ``--device-id``."""

    @property
    def ok(self) -> bool:
        return not self.issues


def check_entry(model: GpuModel, entry: MigEntry) -> str | None:
    """Why ``entry`` cannot be applied to a GPU of ``model``, or ``None`` if it can."""
    if not entry.mig_enabled:
        return None
    if not model.mig_capable:
        return f"{model.key} does not support MIG; use mig-enabled: false"
    counts: dict[str, int] = {}
    for name, count in entry.mig_devices.items():
        prof = canonical_profile(model, name)
        if prof is None:
            known = ", ".join(p.name for p in model.profiles)
            return f"profile {name} does not exist on {model.key} (known: {known})"
        counts[prof.name] = counts.get(prof.name, 0) + count
    result = place(model, counts)
    return None if result.ok else result.reason


def validate(parsed: Iterable[MigPartedConfig], *, device_id: int | None = None) -> ValidationResult:
    """Check every entry: against its device-filter's models, else ``device_id`` (default H100 80GB).

    With an explicit ``device_id``, entries whose filter excludes it are skipped (they never apply
    to that device) and all others are checked against it.
    """
    issues: list[Issue] = []
    configs = checked = skipped = 0
    default_id = DEFAULT_DEVICE_ID if device_id is None else device_id
    for doc in parsed:
        issues.extend(doc.issues)
        configs += len(doc.configs)
        for name, entries in doc.configs.items():
            for index, entry in enumerate(entries):
                if device_id is not None:
                    if entry.device_filter and device_id not in entry.device_filter:
                        skipped += 1
                        continue
                    targets: Sequence[int] = (device_id,)
                else:
                    targets = entry.device_filter or (default_id,)
                checked += 1
                for did in targets:
                    model = by_device_id(did)
                    if model is None:
                        issues.append(
                            Issue(
                                doc.source,
                                name,
                                index,
                                "device id not in the geometry catalogue",
                                did,
                                "unknown",
                            )
                        )
                        continue
                    reason = check_entry(model, entry)
                    if reason:
                        issues.append(Issue(doc.source, name, index, reason, did, model.key))
    return ValidationResult(tuple(issues), configs, checked, skipped)


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


def config_map(*, name: str, namespace: str, configs: Mapping[str, Sequence[MigEntry]]) -> dict[str, Any]:
    """The MIG Manager's ConfigMap form (``data["config.yaml"]``)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace},
        "data": {"config.yaml": dump(configs)},
    }


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
