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

from gpupilot_common import checked
from gpupilot_common.checked import FieldPath

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


class Reader:
    """Typed access to one JSON object of a :class:`checked.Document`, raising one-line errors in
    the project's shape, ``file:line: field.path: problem``."""

    def __init__(self, doc: checked.Document, data: object, path: FieldPath) -> None:
        if not isinstance(data, dict):
            raise doc.fail(path, f"must be an object, got {type(data).__name__}")
        self.doc, self.data, self.path = doc, data, path

    def get(self, key: str, kinds: type | tuple[type, ...], kind_name: str, default: object = ...) -> Any:
        if key not in self.data:
            if default is not ...:
                return default
            raise self.doc.fail((*self.path, key), f"required, {kind_name}")
        value = self.data[key]
        allowed = kinds if isinstance(kinds, tuple) else (kinds,)
        ok = isinstance(value, allowed) and not (isinstance(value, bool) and bool not in allowed)
        if not ok:
            raise self.doc.fail((*self.path, key), f"must be {kind_name}, got {value!r:.40}")
        return value

    def sub(self, key: str, data: object, *index: int) -> Reader:
        return Reader(self.doc, data, (*self.path, key, *index))


_SCALARS: dict[type, tuple[tuple[type, ...], str]] = {
    str: ((str,), "a string"),
    int: ((int,), "an integer"),
    float: ((int, float), "a number"),
    bool: ((bool,), "true or false"),
}


_HINTS: dict[type, dict[str, Any]] = {}


def _check_mig_doc(r: Reader) -> None:
    """A mig-parted document: its ``mig-configs`` (when present) maps each config name to a list of
    entries (objects); the entries themselves are checked by ``apply``'s plan check."""
    if "mig-configs" not in r.data:
        return
    configs = r.sub("mig-configs", r.data["mig-configs"])
    for name in configs.data:
        if not isinstance(name, str):
            raise r.doc.fail(configs.path, f"config names must be strings, got {name!r:.40}")
        for i, entry in enumerate(configs.get(name, list, "a list")):
            configs.sub(name, entry, i)


def _hints(cls: type) -> dict[str, Any]:
    """The field types of ``cls`` (resolved once per class)."""
    if cls not in _HINTS:
        _HINTS[cls] = get_type_hints(cls)
    return _HINTS[cls]


def from_json(cls: type[Any], r: Reader) -> Any:
    """An instance of the dataclass ``cls`` from the JSON object ``r``."""
    kwargs: dict[str, Any] = {}
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            default: object = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = ...
        kwargs[f.name] = _decode(hints[f.name], r, f.name, default, f.metadata)
    return cls(**kwargs)


def _decode(hint: Any, r: Reader, key: str, default: object, meta: Mapping[str, Any]) -> Any:
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):  # ``float | None``: absent or null is None
        (inner,) = [a for a in get_args(hint) if a is not type(None)]
        return None if r.data.get(key) is None else _decode(inner, r, key, ..., meta)
    if hint in _SCALARS:
        kinds, name = _SCALARS[hint]
        return hint(r.get(key, kinds, name, default))
    if dataclasses.is_dataclass(hint):
        if key not in r.data and default is not ...:
            return default
        return from_json(hint, r.sub(key, r.get(key, dict, "an object")))  # type: ignore[arg-type]
    if origin is tuple:
        item = get_args(hint)[0]
        values = r.get(key, list, "a list", [] if default is not ... else ...)
        if dataclasses.is_dataclass(item):
            return tuple(from_json(item, r.sub(key, v, i)) for i, v in enumerate(values))  # type: ignore[arg-type]
        kinds, name = _SCALARS[item]
        for i, v in enumerate(values):
            if not isinstance(v, kinds) or (isinstance(v, bool) and item is not bool):
                raise r.doc.fail((*r.path, key, i), f"must be {name}, got {v!r:.40}")
        return tuple(item(v) for v in values)
    if origin in (Mapping, dict) or hint is dict:
        value: JsonDict = r.get(key, dict, "an object", {} if default is not ... else ...)
        if meta.get("mig_doc"):
            _check_mig_doc(r.sub(key, value))
        if meta.get("counts"):
            for name, count in value.items():
                if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                    raise r.doc.fail((*r.path, key, name), f"must be a count >= 0, got {count!r:.40}")
        return dict(value)
    raise TypeError(f"plan codec: no reader for {key}: {hint}")  # pragma: no cover - a programming error
