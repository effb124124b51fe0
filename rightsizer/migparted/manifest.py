"""Whole YAML files as users have them: find the NVIDIA configs in a (multi-document) manifest.

A file may hold a bare mig-parted document, a bare device-plugin sharing config, or any number of
Kubernetes objects (NVIDIA's MIG Manager example ships a DaemonSet, a ServiceAccount, RBAC and the
ConfigMap in one file). ConfigMaps are searched for mig-parted configs (``mig-configs``) and
device-plugin time-slicing configs (``sharing``) under any data key; every other object is skipped
with a note. Every problem is ONE line naming the file (and, for YAML errors, the line of the outer
file, also for YAML embedded in a ConfigMap); nothing here raises anything but
:class:`~rightsizer.migparted.config.MigPartedError`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpupilot_common import yamlsafe
from rightsizer.migparted.config import Issue, MigPartedConfig, MigPartedError, parse_document
from rightsizer.migparted.timeslicing import SharingConfig

MAX_BYTES = 1024 * 1024
"""Larger files are refused: NVIDIA's biggest config is ~12 KB; 1 MiB (~9,000 configs) checks in ~4 s."""
MAX_DEPTH = 64
"""Deeper nesting is refused before PyYAML's recursive composer can overflow the stack."""


@dataclass
class Manifest:
    """What a file holds: mig-parted configs, sharing configs, and notes on what was skipped."""

    source: str
    mig: list[MigPartedConfig] = field(default_factory=list)
    sharing: list[SharingConfig] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def read_text(path: Path) -> str:
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise MigPartedError(f"{path}: {size} bytes is too large for a config file (limit {MAX_BYTES})")
        return yamlsafe.read_text(path)
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc).splitlines()[0]
        raise MigPartedError(f"{path}: cannot read: {reason}") from exc


def load_path(path: Path) -> Manifest:
    return load_manifest(read_text(path), source=str(path))


def _too_deep(text: str) -> int | None:
    """Line of the first flow/block nesting deeper than MAX_DEPTH (cheap scan, no YAML parse)."""
    depth = 0
    line = 1
    in_quote = ""
    for ch in text:
        if ch == "\n":
            line += 1
        if in_quote:
            if ch == in_quote:
                in_quote = ""
            continue
        if ch in "\"'":
            in_quote = ch
        elif ch in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return line
        elif ch in "]}":
            depth = max(0, depth - 1)
    indents = [len(ln) - len(ln.lstrip(" -")) for ln in text.splitlines()]
    for i, ind in enumerate(indents, 1):
        if ind > 2 * MAX_DEPTH + 16:
            return i
    return None


def yaml_documents(text: str, *, source: str, line_offset: int = 0) -> list[tuple[Any, yaml.Node | None]]:
    """Every document of ``text`` with its node (for line numbers); one-line errors."""
    if len(text) > MAX_BYTES:
        raise MigPartedError(f"{source}: too large for a config ({len(text)} characters, limit {MAX_BYTES})")
    deep = _too_deep(text)
    if deep is not None:
        raise MigPartedError(
            f"{source}:{deep + line_offset}: invalid YAML: nesting deeper than {MAX_DEPTH} levels"
        )
    try:
        found = yamlsafe.load_all_with_nodes(text)  # libyaml, bounded as every reader is
    except yaml.YAMLError as exc:
        raise MigPartedError(yaml_error(source, exc, offset=line_offset)) from exc
    except RecursionError as exc:
        raise MigPartedError(f"{source}: invalid YAML: nesting too deep") from exc
    except (ValueError, TypeError, IndexError) as exc:  # PyYAML on ``!!int a`` or ``!!int`` alone
        raise MigPartedError(
            f"{source}: invalid YAML: a tagged value cannot be read ({type(exc).__name__}); "
            "remove the !!tag or fix the value"
        ) from exc
    return found


def yaml_error(source: str, exc: yaml.YAMLError, *, offset: int) -> str:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    if mark is not None:
        return f"{source}:{mark.line + 1 + offset}: invalid YAML: {problem}"
    return f"{source}: invalid YAML: {problem}"


def _name(doc: Mapping[Any, Any]) -> str:
    meta = doc.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    return str(name) if isinstance(name, (str, int)) else "?"


def _is_object(doc: object) -> bool:
    return isinstance(doc, dict) and "kind" in doc and "apiVersion" in doc


def load_manifest(text: str, *, source: str) -> Manifest:
    """Every NVIDIA config in ``text``; other Kubernetes objects become notes."""
    out = Manifest(source)
    docs = yaml_documents(text, source=source)
    present = [(i, d, n) for i, (d, n) in enumerate(docs) if d is not None]
    for index, doc, node in present:
        label = source if len(present) == 1 else f"{source} document {index + 1}"
        if _is_object(doc):
            assert isinstance(doc, dict)
            kind = doc.get("kind")
            meta = doc.get("metadata")
            if meta is not None and not isinstance(meta, dict):
                raise MigPartedError(
                    f"{source}:{_key_line(node, 'metadata') + 1}: {kind} metadata must be a mapping "
                    f"(name, namespace, labels), got {type(meta).__name__}; fix the manifest"
                )
            if kind == "ConfigMap":
                _config_map(out, doc, node, label=label, file_source=source)
            else:
                out.notes.append(f"{label}: {kind} {_name(doc)} skipped (not a MIG or sharing config)")
        elif isinstance(doc, dict) and _PLUGIN_KEYS & set(doc) and "mig-configs" not in doc:
            out.sharing.append(SharingConfig(label, doc))
        else:
            out.mig.append(parse_document(doc, source=label))
    return out


def _config_map(
    out: Manifest, doc: Mapping[Any, Any], node: yaml.Node | None, *, label: str, file_source: str
) -> None:
    name = _name(doc)
    where = f"{label} (ConfigMap {name})"
    data = doc.get("data")
    if data is None:
        out.notes.append(f"{where}: no data; skipped")
        return
    if not isinstance(data, dict):
        out.mig.append(_broken(where, f"data must be a mapping of key → text, got {type(data).__name__}"))
        return
    found = False
    for key, value in data.items():
        if not isinstance(value, str):
            continue
        kind = _content_kind(value)
        if kind is None:
            continue
        found = True
        offset = _value_line(node, str(key))
        inner = yaml_documents(value, source=file_source, line_offset=offset)
        values = [d for d, _ in inner if d is not None]
        src = f"{where} data.{key}"
        if len(values) != 1:
            out.mig.append(_broken(src, f"expected one YAML document, found {len(values)}"))
            continue
        if kind == "mig":
            out.mig.append(parse_document(values[0], source=src))
        else:
            out.sharing.append(SharingConfig(src, values[0]))
    if not found:
        out.notes.append(f"{where}: no mig-parted or sharing config under data; skipped")


_MIG_KEY = re.compile(r"^\s*[\"']?mig-configs[\"']?\s*:", re.MULTILINE)
_SHARING_KEY = re.compile(r"^\s*[\"']?(sharing|timeSlicing|mps|flags|imex)[\"']?\s*:", re.MULTILINE)
_PLUGIN_KEYS = frozenset({"sharing", "flags", "resources", "imex"})
"""Keys only a device-plugin config has at its top (mig-parted's has ``mig-configs``)."""


def _content_kind(text: str) -> str | None:
    """``mig`` / ``sharing`` when the text has that config's top key on a line of its own."""
    if _MIG_KEY.search(text):
        return "mig"
    if _SHARING_KEY.search(text):
        return "sharing"
    return None


def _value_line(node: yaml.Node | None, key: str) -> int:
    """Lines before the first line of a block scalar under ``data.<key>`` (0 if not found)."""
    if not isinstance(node, yaml.MappingNode):
        return 0
    for k, v in node.value:
        if getattr(k, "value", None) == "data" and isinstance(v, yaml.MappingNode):
            for dk, dv in v.value:
                if getattr(dk, "value", None) == key:
                    # A block scalar (|) starts on the line after its key.
                    return int(dv.start_mark.line) + (1 if dv.style in ("|", ">") else 0)
    return 0


def _key_line(node: yaml.Node | None, key: str) -> int:
    """The 0-based line of a top-level ``key`` of a document (its first line if not found)."""
    if not isinstance(node, yaml.MappingNode):
        return 0
    for k, _v in node.value:
        if getattr(k, "value", None) == key:
            return int(k.start_mark.line)
    return int(node.start_mark.line)


def _broken(source: str, reason: str) -> MigPartedConfig:
    return MigPartedConfig(source, {}, (Issue(source, "", None, reason),))
