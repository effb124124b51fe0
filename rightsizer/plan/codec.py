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
from collections.abc import Callable, Mapping
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
    for name, omit, meta in _writers(type(obj)):
        value = getattr(obj, name)
        if omit and not value:
            continue
        out[name] = _encode(value, meta)
    return out


_Writer = tuple[tuple[str, bool, Mapping[str, Any]], ...]
_WRITERS: dict[type, _Writer] = {}


def _writers(cls: type) -> _Writer:
    """Each field's name, whether an empty value is left out, and its metadata: read once per class
    (a plan of 80,000 GPUs writes about a million dataclass fields)."""
    found = _WRITERS.get(cls)
    if found is None:
        found = tuple(
            (f.name, bool(f.metadata.get("omit_empty")), f.metadata) for f in dataclasses.fields(cls)
        )
        _WRITERS[cls] = found
    return found


def _encode(value: Any, meta: Mapping[str, Any]) -> Any:
    if isinstance(value, str | int | bool) or value is None:
        return value
    if isinstance(value, float):
        return round(value, meta["digits"]) if "digits" in meta else value
    if isinstance(value, tuple):
        return [_encode(v, _NONE) for v in value]
    if isinstance(value, Mapping):
        return dict(sorted(value.items())) if meta.get("counts") else dict(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_json(value)
    return value


_NONE: Mapping[str, Any] = {}


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


Reader = Callable[[Section, str, object], Any]
"""Reads one field: (the object's section, the key, the default or ``REQUIRED``) → its value."""
_READERS: dict[type, tuple[tuple[str, Reader, object, bool], ...]] = {}


def from_json(cls: type[Any], r: Section) -> Any:
    """An instance of the dataclass ``cls`` from the JSON object ``r``."""
    kwargs: dict[str, Any] = {}
    for name, read, default, factory in _readers(cls):
        kwargs[name] = read(r, name, default() if factory else default)  # type: ignore[operator]
    return cls(**kwargs)


def _readers(cls: type) -> tuple[tuple[str, Reader, object, bool], ...]:
    """Each field's name, reader, default (or factory) and whether it is a factory: worked out once
    per class from its type hints (a plan of 80,000 GPUs reads about a million fields)."""
    found = _READERS.get(cls)
    if found is None:
        hints = _hints(cls)
        out = []
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING:
                default, factory = f.default, False
            elif f.default_factory is not dataclasses.MISSING:
                default, factory = f.default_factory, True
            else:
                default, factory = REQUIRED, False
            out.append((f.name, _reader(hints[f.name], f.metadata), default, factory))
        found = _READERS[cls] = tuple(out)
    return found


def _reader(hint: Any, meta: Mapping[str, Any]) -> Reader:
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):  # ``float | None``: absent or null is None
        (inner,) = [a for a in get_args(hint) if a is not type(None)]
        read_inner = _reader(inner, meta)
        return lambda r, key, _d: None if r.data.get(key) is None else read_inner(r, key, REQUIRED)
    if hint in _SCALARS:
        kinds, name = _SCALARS[hint]
        return lambda r, key, default: hint(r.typed(key, kinds, name, default))
    if dataclasses.is_dataclass(hint):

        def nested(r: Section, key: str, default: object) -> Any:
            if key not in r.data and default is not REQUIRED:
                return default
            return from_json(hint, obj(r, r.typed(key, dict, OBJECT), key))  # type: ignore[arg-type]

        return nested
    if origin is tuple:
        return _tuple_reader(get_args(hint)[0])
    if origin in (Mapping, dict) or hint is dict:
        return lambda r, key, default: _mapping(r, key, default, meta)
    raise TypeError(f"plan codec: no reader for {hint}")  # pragma: no cover - a programming error


def _tuple_reader(item: Any) -> Reader:
    def read(r: Section, key: str, default: object) -> Any:
        values = r.typed(key, list, "a list", [] if default is not REQUIRED else REQUIRED)
        if dataclasses.is_dataclass(item):
            return tuple(from_json(item, obj(r, v, key, i)) for i, v in enumerate(values))  # type: ignore[arg-type]
        kinds, name = _SCALARS[item]
        for i, v in enumerate(values):
            if not isinstance(v, kinds) or (isinstance(v, bool) and item is not bool):
                raise r.doc.fail((*r.path, key, i), f"must be {name}, got {v!r:.40}")
        return tuple(item(v) for v in values)

    return read


def _mapping(r: Section, key: str, default: object, meta: Mapping[str, Any]) -> dict[str, Any]:
    value: JsonDict = r.typed(key, dict, OBJECT, {} if default is not REQUIRED else REQUIRED)
    if meta.get("mig_doc"):
        _check_mig_doc(obj(r, value, key))
    if meta.get("counts"):
        for name, count in value.items():
            if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                raise r.doc.fail((*r.path, key, name), f"must be a count >= 0, got {count!r:.40}")
    return dict(value)
