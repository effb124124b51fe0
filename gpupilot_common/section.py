"""Typed getters over one mapping of a :class:`~gpupilot_common.checked.Document`: each checks one
field and fails with the document's one line, ``file:line: field.path: problem``.

    top = checked.load_yaml(path, error=ServeConfigError).root()
    top.keys(("listen", "plan"))
    every = top.section("plan").duration("every", default=6 * 3600, minimum=60)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any, Protocol, overload

from gpupilot_common.fieldpath import FieldPath
from gpupilot_common.fieldpath import short_value as _short
from gpupilot_common.timefmt import parse_duration, parse_time


class Source(Protocol):
    """What a section reads of its document (a :class:`~gpupilot_common.checked.Document`, which
    builds sections and so is not imported here): the one-line error for a field path."""

    def fail(self, path: FieldPath, problem: str) -> Exception: ...


class _Required:
    """The default of a getter whose field must be given (:data:`REQUIRED`)."""

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED = _Required()
"""A getter's default when the field has none: absent or null is an error naming what to give."""


def _bound(minimum: float | None, maximum: float | None, show: Callable[[float], str]) -> str:
    if minimum is not None and maximum is not None:
        return f" from {show(minimum)} to {show(maximum)}"
    if minimum is not None:
        return f" >= {show(minimum)}"
    return f" <= {show(maximum)}" if maximum is not None else ""


def _whole_text(value: object) -> bool:
    """``"8"``: a whole number written as text (ASCII digits, at most 18 of them)."""
    return (
        isinstance(value, str)
        and value.strip().isascii()
        and value.strip().isdigit()
        and len(value.strip()) <= 18
    )


class Section:
    """A mapping at ``path`` of a :class:`Document`; each getter checks one field.

    ``coerce``: scalars are read as the type asked for, as YAML writers expect of a hand-written
    file: a number where text is wanted is its text (``driver_version: 535``), a whole number
    written as text where a whole number is wanted is that number (``count: "2"``). Sections
    reached from this one inherit it."""

    def __init__(self, doc: Source, data: dict[Any, Any], path: FieldPath, *, coerce: bool = False) -> None:
        self.doc, self.data, self.path, self.coerce = doc, data, path, coerce

    def __contains__(self, key: str) -> bool:
        return key in self.data

    def fail(self, key: str, problem: str) -> Exception:
        return self.doc.fail((*self.path, key), problem)

    def fail_here(self, problem: str) -> Exception:
        """The one-line error for this section as a whole (a rule between its fields)."""
        return self.doc.fail(self.path, problem)

    def keys(self, allowed: Iterable[str]) -> None:
        known = tuple(allowed)
        for key in self.data:
            if key not in known:
                raise self.fail(str(key), f"unknown field (known: {', '.join(known)})")

    def raw(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    def typed(self, key: str, kinds: type | tuple[type, ...], what: str, default: object = REQUIRED) -> Any:
        """The value under ``key`` as it is, when it is an instance of ``kinds`` (``bool`` only
        when named: it is an ``int`` to Python); ``what`` names the kinds in the message (``"an
        integer"``). For readers driven by declared types, such as a dataclass codec; a null is a
        value here, not an absent field."""
        if key not in self.data:
            if default is REQUIRED:
                raise self.fail(key, f"required, {what}")
            return default
        value = self.data[key]
        allowed = kinds if isinstance(kinds, tuple) else (kinds,)
        if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
            raise self.fail(key, f"must be {what}, got {_short(value)}")
        return value

    def text(self, key: str, default: str | None = None) -> str:
        v = self.data.get(key, default)
        if self.coerce and isinstance(v, int | float) and not isinstance(v, bool):
            v = str(v)
        if v is None:
            raise self.fail(key, "required, a non-empty string")
        if not isinstance(v, str):
            raise self.fail(key, f"must be a string, got {_short(v)}")
        if not v:
            raise self.fail(key, "must not be empty")
        return v

    def optional_text(self, key: str) -> str | None:
        return None if self.data.get(key) is None else self.text(key)

    def text_map(self, key: str) -> dict[str, str]:
        """The mapping of names to strings under ``key`` (empty when absent or null)."""
        sub = self.named(key)
        return {} if sub is None else {k: sub.text(k) for k in sub.data}

    def boolean(self, key: str, default: bool) -> bool:
        v = self.data.get(key, default)
        if not isinstance(v, bool):
            raise self.fail(key, f"must be true or false, got {_short(v)}")
        return v

    @overload
    def integer(
        self,
        key: str,
        default: int | _Required = REQUIRED,
        *,
        minimum: int | None = 0,
        maximum: int | None = None,
    ) -> int: ...
    @overload
    def integer(
        self, key: str, default: None, *, minimum: int | None = 0, maximum: int | None = None
    ) -> int | None: ...
    def integer(
        self,
        key: str,
        default: int | _Required | None = REQUIRED,
        *,
        minimum: int | None = 0,
        maximum: int | None = None,
    ) -> int | None:
        """A whole number in ``[minimum, maximum]`` (a bound of None: unbounded on that side)."""
        v = self.data.get(key)
        if v is None:
            v = default
        if self.coerce and _whole_text(v):
            v = int(str(v))
        bound = _bound(minimum, maximum, lambda x: f"{x:.0f}")
        if v is REQUIRED:
            raise self.fail(key, f"required, a whole number{bound}")
        if v is None:
            return None
        if (
            isinstance(v, bool)
            or not isinstance(v, int)
            or (minimum is not None and v < minimum)
            or (maximum is not None and v > maximum)
        ):
            raise self.fail(key, f"must be a whole number{bound}, got {_short(v)}")
        return v

    @overload
    def number(
        self,
        key: str,
        default: float | _Required = REQUIRED,
        *,
        minimum: float | None = 0.0,
        maximum: float | None = None,
    ) -> float: ...
    @overload
    def number(
        self, key: str, default: None, *, minimum: float | None = 0.0, maximum: float | None = None
    ) -> float | None: ...
    def number(
        self,
        key: str,
        default: float | _Required | None = REQUIRED,
        *,
        minimum: float | None = 0.0,
        maximum: float | None = None,
    ) -> float | None:
        """A finite number in ``[minimum, maximum]`` (a bound of None: unbounded on that side)."""
        v = self.data.get(key)
        if v is None:
            v = default
        bound = _bound(minimum, maximum, lambda x: f"{x:g}")
        if v is REQUIRED:
            raise self.fail(key, f"required, a number{bound}")
        if v is None:
            return None
        if (
            isinstance(v, bool)
            or not isinstance(v, int | float)
            or not math.isfinite(v)
            or (minimum is not None and v < minimum)
            or (maximum is not None and v > maximum)
        ):
            raise self.fail(key, f"must be a number{bound}, got {_short(v)}")
        return float(v)

    def duration(self, key: str, default: float, *, minimum: float = 0.0, allow_zero: bool = False) -> float:
        """A duration in Prometheus' grammar (``90s``, ``1h30m``, ``7d``), in seconds; zero is
        refused unless ``allow_zero``."""
        v = self.data.get(key)
        if v is None:
            return default
        try:
            seconds = parse_duration(str(v), allow_zero=allow_zero)
        except ValueError as exc:
            raise self.fail(key, str(exc)) from None
        if seconds < minimum:
            raise self.fail(key, f"must be at least {minimum:g}s, got {v}")
        return seconds

    def time(self, key: str, default: float, *, now: float) -> float:
        """A moment (RFC 3339, a date, Unix seconds, ``now-7d``) as Unix seconds."""
        v = self.data.get(key)
        if v is None:
            return default
        try:
            return parse_time(v, now=now)
        except ValueError as exc:
            raise self.fail(key, str(exc)) from None

    def sequence(self, key: str, *, required: bool = False) -> list[Any]:
        """The list under ``key`` (empty when absent or null, unless ``required``: then it must
        hold at least one item)."""
        v = self.data.get(key)
        if v is None:
            if required:
                raise self.fail(key, "required, give a list")
            return []
        if not isinstance(v, list):
            raise self.fail(key, f"must be a list, got {_short(v)}")
        if required and not v:
            raise self.fail(key, "must not be empty")
        return v

    def sections(
        self, key: str, *, what: str = "a mapping of fields", required: bool = False
    ) -> list[Section]:
        """The list of mappings under ``key``, each a :class:`Section` at ``key[i]``."""
        return [
            self.at(item, key, i, what=what) for i, item in enumerate(self.sequence(key, required=required))
        ]

    def section(self, key: str) -> Section | None:
        """The mapping under ``key`` (None when absent or null)."""
        v = self.data.get(key)
        return None if v is None else self.at(v, key)

    def named(self, key: str) -> Section | None:
        """The mapping under ``key`` with its keys as text (None when absent or null): for mappings
        whose keys the user names (labels, metric names), which YAML may read as numbers (``8:``)."""
        sub = self.section(key)
        return None if sub is None else self.at({str(k): v for k, v in sub.data.items()}, key)

    def at(self, data: object, *keys: str | int, what: str = "a mapping of fields") -> Section:
        """A :class:`Section` over ``data`` at ``keys`` below this one: a mapping found or built by
        the reader (a list item, a short form such as ``node/0`` written out as its fields)."""
        path = (*self.path, *keys)
        if not isinstance(data, dict):
            raise self.doc.fail(path, f"must be {what}, got {_short(data)}")
        return Section(self.doc, data, path, coerce=self.coerce)
