"""The prometheus-operator's CRDs, and offline validation of objects against their schemas.

The CRDs are generated from the operator's own API types at a pinned release by ``devkit.gobuild``
(the ``prometheus-operator-crds`` tool: controller-gen over ``…/pkg/apis/monitoring``, as upstream's
``make generate-crds`` does), into the tools cache: :func:`crd_dir` is the folder a later step can
``kubectl apply -f``. Nothing of upstream's is committed here.

:func:`validate` checks an object against the ``openAPIV3Schema`` of its kind and version the way
kube-apiserver does with ``kubectl apply --validate=strict``: types, enums, patterns, bounds,
required fields and unknown fields (which the API server would otherwise prune in silence), with
Kubernetes' ``x-kubernetes-int-or-string`` and ``x-kubernetes-preserve-unknown-fields``. The CEL rules
(``x-kubernetes-validations``) are not evaluated offline: :func:`cel_rules` counts those an object
meets, so a report can say what only a real API server checks.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from devkit import gobuild

TOOL = "prometheus-operator-crds"
GROUP = "monitoring.coreos.com"


class CRDError(RuntimeError):
    pass


def crd_dir(*, build_missing: bool = True) -> Path:
    """The folder of the generated CRD manifests (``monitoring.coreos.com_<plural>.yaml``)."""
    try:
        folder = gobuild.binary(TOOL, "controller-gen", build_missing=build_missing).parent / "crds"
    except gobuild.GoToolError as exc:
        raise CRDError(str(exc)) from None
    if not any(folder.glob(f"{GROUP}_*.yaml")):
        raise CRDError(f"{TOOL}: no CRDs in {folder}")
    return folder


@dataclass(frozen=True)
class Schema:
    kind: str
    version: str
    schema: Mapping[str, Any]


class _Loader(yaml.SafeLoader):
    """YAML 1.2 reading of a bare ``=`` (an enum value in the operator's CRDs): a string, not PyYAML's
    1.1 ``value`` tag, which it cannot construct."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:value"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


@cache
def schemas(folder: Path) -> dict[tuple[str, str], Schema]:
    """``(kind, version)`` → the served version's schema, for every CRD in ``folder``."""
    out: dict[tuple[str, str], Schema] = {}
    for path in sorted(folder.glob("*.yaml")):
        doc = yaml.load(path.read_text(), Loader=_Loader)  # noqa: S506 - a SafeLoader
        kind = doc["spec"]["names"]["kind"]
        for ver in doc["spec"]["versions"]:
            if ver.get("served"):
                out[(kind, ver["name"])] = Schema(kind, ver["name"], ver["schema"]["openAPIV3Schema"])
    return out


def _type_ok(value: object, expected: str) -> bool:
    match expected:
        case "object":
            return isinstance(value, dict)
        case "array":
            return isinstance(value, list)
        case "string":
            return isinstance(value, str)
        case "integer":
            return isinstance(value, int) and not isinstance(value, bool)
        case "number":
            return isinstance(value, (int, float)) and not isinstance(value, bool)
        case "boolean":
            return isinstance(value, bool)
    return True


def _problems(value: object, schema: Mapping[str, Any], where: str) -> Iterator[str]:
    if value is None:
        if not schema.get("nullable"):
            yield f"{where}: null where the schema wants {schema.get('type', 'a value')}"
        return
    if schema.get("x-kubernetes-int-or-string"):
        if not (isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))):
            yield f"{where}: {value!r} is neither an integer nor a string"
        return
    expected = schema.get("type")
    if expected and not _type_ok(value, expected):
        yield f"{where}: {type(value).__name__} {value!r:.60} where the schema wants {expected}"
        return
    yield from _scalar_problems(value, schema, where)
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            yield f"{where}: {len(value)} items, under {schema['minItems']}"
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            yield f"{where}: {len(value)} items, over {schema['maxItems']}"
        items = schema.get("items")
        if isinstance(items, Mapping):
            for i, item in enumerate(value):
                yield from _problems(item, items, f"{where}[{i}]")
    if isinstance(value, dict):
        yield from _object_problems(value, schema, where)


def _scalar_problems(value: object, schema: Mapping[str, Any], where: str) -> Iterator[str]:
    if "enum" in schema and value not in schema["enum"]:
        yield f"{where}: {value!r} is not one of {schema['enum']}"
    if isinstance(value, str):
        if "pattern" in schema and not re.search(schema["pattern"], value):
            yield f"{where}: {value!r} does not match {schema['pattern']}"
        if len(value) < schema.get("minLength", 0):
            yield f"{where}: {value!r} is shorter than {schema['minLength']}"
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            yield f"{where}: {len(value)} characters, over {schema['maxLength']}"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            yield f"{where}: {value} is below {schema['minimum']}"
        if "maximum" in schema and value > schema["maximum"]:
            yield f"{where}: {value} is above {schema['maximum']}"


def _object_problems(value: dict[str, object], schema: Mapping[str, Any], where: str) -> Iterator[str]:
    props: Mapping[str, Any] = schema.get("properties") or {}
    for name in schema.get("required") or []:
        if name not in value:
            yield f"{where}: required field {name!r} missing"
    extra = schema.get("additionalProperties")
    for key, item in value.items():
        path = f"{where}.{key}"
        if key in props:
            yield from _problems(item, props[key], path)
        elif isinstance(extra, Mapping):
            yield from _problems(item, extra, path)
        elif extra is True or schema.get("x-kubernetes-preserve-unknown-fields"):
            continue
        elif props or extra is False:
            yield f"{path}: unknown field (the API server would drop it; --validate=strict refuses it)"


def validate(obj: Mapping[str, Any], folder: Path) -> list[str]:
    """Every way ``obj`` breaks its CRD's schema, one line each naming the object and the field."""
    api, kind = str(obj.get("apiVersion", "")), str(obj.get("kind", ""))
    group, _, version = api.rpartition("/")
    name = f"{kind} {(obj.get('metadata') or {}).get('name', '?')}"
    if group != GROUP:
        return [f"{name}: apiVersion {api} is not {GROUP}/*"]
    found = schemas(folder).get((kind, version))
    if found is None:
        return [f"{name}: the prometheus-operator's CRDs serve no {kind} in {api}"]
    # metadata is the API server's ObjectMeta, not part of the CRD's schema
    body = {k: v for k, v in obj.items() if k != "metadata"}
    schema = dict(found.schema)
    schema["properties"] = {k: v for k, v in (schema.get("properties") or {}).items() if k != "metadata"}
    return [f"{name}: {p}" for p in _problems(body, schema, "")]


def cel_rules(obj: Mapping[str, Any], folder: Path) -> int:
    """How many CEL rules (``x-kubernetes-validations``) apply to the fields ``obj`` sets: what only
    a real API server checks."""
    api, kind = str(obj.get("apiVersion", "")), str(obj.get("kind", ""))
    found = schemas(folder).get((kind, api.rpartition("/")[2]))
    if found is None:
        return 0

    def count(value: object, schema: Mapping[str, Any]) -> int:
        n = len(schema.get("x-kubernetes-validations") or [])
        if isinstance(value, dict):
            props = schema.get("properties") or {}
            n += sum(count(v, props[k]) for k, v in value.items() if k in props)
        elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
            n += sum(count(v, schema["items"]) for v in value)
        return n

    return count({k: v for k, v in obj.items() if k != "metadata"}, found.schema)
