"""Merging a plan's mig-parted configs into the MIG Manager's ConfigMap without dropping anyone's.

The MIG Manager reads one mig-parted file (``data["config.yaml"]``) from the ConfigMap named by the
ClusterPolicy's ``spec.migManager.config.name``. Nodes labelled with configs from that file must keep
resolving after we repoint or rewrite it, so the merged file is: the configs of the ConfigMap the
ClusterPolicy points at now, plus those already in our target ConfigMap, plus the plan's (whose
``gpupilot-<hash>`` names are content-addressed: the same name always means the same layout).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from gpupilot_common import yamlsafe
from gpupilot_common.text import one_line
from rightsizer.errors import RightsizerError
from rightsizer.plan.model import Plan

_BaseDumper: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


class _Dumper(_BaseDumper):  # type: ignore[misc]
    """No ``&id001`` anchors (configs share lists in memory; readers should not have to follow them),
    multi-line strings as ``|`` blocks."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str_block(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _str_block)


def dump_yaml(doc: Any) -> str:
    """YAML for people: block lists, ``|`` for embedded files, no anchors."""
    text: str = yaml.dump(doc, Dumper=_Dumper, sort_keys=False, default_flow_style=None, width=100)
    return text


DATA_KEY = "config.yaml"
OPERATOR_DEFAULT_CONFIGMAP = "default-mig-parted-config"
GPUPILOT_CONFIGMAP = "gpupilot-mig-parted-config"


class ConfigMapError(RightsizerError, ValueError):
    """A ConfigMap whose mig-parted content cannot be read; one line naming it."""


@functools.lru_cache(maxsize=8)
def _parsed(text: str) -> Any:
    """A ``config.yaml`` as parsed, once per text, through the project's bounded reader (aliases,
    depth and size: a few hundred bytes of nested aliases stood for gigabytes): the operator's
    default file holds every model's configs (about 50 ms to parse with libyaml), and a run reads
    the same text more than once (serve's runs again and again). Callers read the result; they
    never change it."""
    if len(text) > yamlsafe.MAX_BYTES:
        raise yamlsafe.YamlLimitError(problem=f"larger than {yamlsafe.MAX_BYTES >> 20} MiB")
    docs = yamlsafe.load_all_with_nodes(text)
    if len(docs) > 1:
        raise yamlsafe.YamlLimitError(problem="more than one YAML document")
    return (docs[0][0] if docs else None) or {}


def configs_of(configmap: Mapping[str, Any] | None) -> dict[str, Any]:
    """``mig-configs`` of a ConfigMap's ``config.yaml`` (any single key if that one is absent)."""
    if configmap is None:
        return {}
    meta = configmap.get("metadata") or {}
    where = f"ConfigMap {meta.get('namespace', '')}/{meta.get('name', '')}"
    data = configmap.get("data") or {}
    text = data.get(DATA_KEY)
    if text is None:
        if len(data) != 1:
            return {}
        text = next(iter(data.values()))
    try:
        doc = _parsed(str(text))
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or exc.__class__.__name__
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigMapError(
            f"{where}: {DATA_KEY} is not valid YAML{at} ({one_line(str(problem))}); fix it first"
        ) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("mig-configs", {}), dict):
        raise ConfigMapError(f"{where}: {DATA_KEY} has no 'mig-configs' mapping; fix it first")
    return dict(doc.get("mig-configs") or {})


def plan_configs(plan: Plan) -> dict[str, Any]:
    """Every config the plan's changed nodes need (and the plan-wide document)."""
    out = dict((plan.mig_parted_config or {}).get("mig-configs") or {})
    for node in plan.changed_nodes:
        out.update((node.config_document or {}).get("mig-configs") or {})
    return out


@dataclass(frozen=True)
class Merge:
    configs: dict[str, Any]
    kept: tuple[str, ...]
    added: tuple[str, ...]
    replaced: tuple[str, ...]

    @property
    def document(self) -> dict[str, Any]:
        return {"version": "v1", "mig-configs": self.configs}

    def render(self) -> str:
        return _rendered(self.document)


_RENDERED: dict[str, str] = {}
_RENDERED_MAX = 4
_RENDERED_LOCK = threading.Lock()


def _rendered(document: dict[str, Any]) -> str:
    """``dump_yaml(document)``, once per content: the merged file carries the operator's default
    configs for every GPU model (about 30 ms of PyYAML's representer), and serve's runs and apply's
    retries render the same content again and again. ``repr`` is the key (C-speed, and unlike JSON it
    tells ``1`` from ``"1"``); a few recent contents are kept."""
    key = repr(document)
    with _RENDERED_LOCK:
        text = _RENDERED.get(key)
    if text is None:
        text = dump_yaml(document)
        with _RENDERED_LOCK:
            if len(_RENDERED) >= _RENDERED_MAX:
                _RENDERED.pop(next(iter(_RENDERED)))
            _RENDERED[key] = text
    return text


def merge(*, existing: list[dict[str, Any]], wanted: Mapping[str, Any]) -> Merge:
    """Union of ``existing`` config maps (earlier first) with ``wanted`` on top."""
    base: dict[str, Any] = {}
    for configs in existing:
        base.update(configs)
    merged = dict(base)
    added, replaced = [], []
    for name, entries in wanted.items():
        if name not in base:
            added.append(name)
        elif base[name] != entries:
            replaced.append(name)
        merged[name] = entries
    kept = tuple(n for n in base if n not in wanted)
    return Merge(merged, kept, tuple(added), tuple(replaced))
