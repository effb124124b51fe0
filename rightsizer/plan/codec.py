"""plan.json ↔ the plan's dataclasses, driven by the dataclasses themselves: each class of
:mod:`rightsizer.plan.model` is written once, and its fields say how they travel.

A field's JSON key is its name; its type decides how it is read (``str``, ``int``, ``float``,
``float | None``, ``bool``, a mapping, a nested dataclass, or a tuple of ints, strings or
dataclasses). A field with a default may be missing from the file (older plans), one without is
required. Field metadata: ``digits`` rounds a float when written, ``omit_empty`` leaves an empty
value out of the file, ``counts`` checks a mapping's values are counts >= 0, ``mig_doc`` checks a
mig-parted document's ``mig-configs``. Every problem is one
:class:`PlanError`-shaped line naming the file, line and field path.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping
from typing import Any, Union, get_args, get_origin, get_type_hints

from gpupilot_common.checked import Document
from gpupilot_common.section import REQUIRED, Section

JsonDict = dict[str, Any]


def digits(n: int) -> dict[str, Any]:
    """Field metadata: round to ``n`` digits when written."""
    return {"digits": n}


OMIT_EMPTY: dict[str, Any] = {"omit_empty": True}
MIG_DOC: dict[str, Any] = {"mig_doc": True}
"""A mig-parted document: ``mig-configs`` must map names to lists of entry objects when present."""
COUNTS: dict[str, Any] = {"counts": True}


# ---------------------------------------------------------------------------------------------- write


def to_json(obj: Any) -> JsonDict:
    """``obj`` (a dataclass instance) as a JSON object, fields in declaration order."""
    out: JsonDict = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if f.metadata.get("omit_empty") and not value:
            continue
        out[f.name] = _encode(value, f.metadata)
    return out


def _encode(value: Any, meta: Mapping[str, Any]) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_json(value)
    if isinstance(value, tuple):
        return [_encode(v, {}) for v in value]
    if isinstance(value, float) and "digits" in meta:
        return round(value, meta["digits"])
    if isinstance(value, Mapping):
        return dict(sorted(value.items())) if meta.get("counts") else dict(value)
    return value


# ---------------------------------------------------------------------------------------------- read


OBJECT = "an object"
"""How the plan names a mapping: JSON's word."""


def obj(parent: Section, data: object, *keys: str | int) -> Section:
    """The JSON object ``data`` at ``keys`` below ``parent``, as a :class:`Section`."""
    return parent.at(data, *keys, what=OBJECT)


def top(doc: Document) -> Section:
    """The document's top-level JSON object."""
    return obj(Section(doc, {}, ()), doc.data)


_SCALARS: dict[type, tuple[tuple[type, ...], str]] = {
    str: ((str,), "a string"),
    int: ((int,), "an integer"),
    float: ((int, float), "a number"),
    bool: ((bool,), "true or false"),
}


_HINTS: dict[type, dict[str, Any]] = {}


def _check_mig_doc(r: Section) -> None:
    """A mig-parted document: its ``mig-configs`` (when present) maps each config name to a list of
    entries (objects); the entries themselves are checked by ``apply``'s plan check."""
    if "mig-configs" not in r.data:
        return
    configs = obj(r, r.data["mig-configs"], "mig-configs")
    for name in configs.data:
        if not isinstance(name, str):
            raise r.doc.fail(configs.path, f"config names must be strings, got {name!r:.40}")
        for i, entry in enumerate(configs.typed(name, list, "a list")):
            obj(configs, entry, name, i)


def _hints(cls: type) -> dict[str, Any]:
    """The field types of ``cls`` (resolved once per class)."""
    if cls not in _HINTS:
        _HINTS[cls] = get_type_hints(cls)
    return _HINTS[cls]


def from_json(cls: type[Any], r: Section) -> Any:
    """An instance of the dataclass ``cls`` from the JSON object ``r``."""
    kwargs: dict[str, Any] = {}
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            default: object = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = REQUIRED
        kwargs[f.name] = _decode(hints[f.name], r, f.name, default, f.metadata)
    return cls(**kwargs)


def _decode(hint: Any, r: Section, key: str, default: object, meta: Mapping[str, Any]) -> Any:
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):  # ``float | None``: absent or null is None
        (inner,) = [a for a in get_args(hint) if a is not type(None)]
        return None if r.data.get(key) is None else _decode(inner, r, key, REQUIRED, meta)
    if hint in _SCALARS:
        kinds, name = _SCALARS[hint]
        return hint(r.typed(key, kinds, name, default))
    if dataclasses.is_dataclass(hint):
        if key not in r.data and default is not REQUIRED:
            return default
        return from_json(hint, obj(r, r.typed(key, dict, OBJECT), key))  # type: ignore[arg-type]
    if origin is tuple:
        item = get_args(hint)[0]
        values = r.typed(key, list, "a list", [] if default is not REQUIRED else REQUIRED)
        if dataclasses.is_dataclass(item):
            return tuple(from_json(item, obj(r, v, key, i)) for i, v in enumerate(values))  # type: ignore[arg-type]
        kinds, name = _SCALARS[item]
        for i, v in enumerate(values):
            if not isinstance(v, kinds) or (isinstance(v, bool) and item is not bool):
                raise r.doc.fail((*r.path, key, i), f"must be {name}, got {v!r:.40}")
        return tuple(item(v) for v in values)
    if origin in (Mapping, dict) or hint is dict:
        value: JsonDict = r.typed(key, dict, OBJECT, {} if default is not REQUIRED else REQUIRED)
        if meta.get("mig_doc"):
            _check_mig_doc(obj(r, value, key))
        if meta.get("counts"):
            for name, count in value.items():
                if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                    raise r.doc.fail((*r.path, key, name), f"must be a count >= 0, got {count!r:.40}")
        return dict(value)
    raise TypeError(f"plan codec: no reader for {key}: {hint}")  # pragma: no cover - a programming error
