"""One way to read checked input: a YAML (or JSON) document read once, then typed getters on its
sections that fail with ONE line, ``file:line: field.path: problem`` (``source: field.path: problem`` for data
that came from no file, such as a test's dict).

Each service keeps its own error tree: the reader is given the exception class to raise (a
``ServeConfigError``, the exporter's ``ConfigError``), so callers catch what they always caught.

    doc = checked.load_yaml(path, error=ServeConfigError)
    top = doc.root()                      # a Section over the top-level mapping
    top.keys(("listen", "plan"))          # unknown fields: one line naming the known ones
    every = top.section("plan").duration("every", default=6 * 3600, minimum=60)

Lines come from the YAML composer's marks (the line of the key, or of the section when the key is
missing), so a problem is found in the file where the reader would look for it; for JSON
(:func:`load_json`) they are found from the text when the first problem is reported. Field paths
read ``metrics[0].name``.
Users: the adapter config, the simulator's scenarios, the exporter's web config, ``rightsizer
serve``'s config and plan.json.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, overload

import yaml

from gpupilot_common import yamlsafe
from gpupilot_common.timefmt import parse_duration, parse_time

ErrorType = Callable[[str], Exception]
FieldPath = tuple[str | int, ...]
"""Mapping keys by name, sequence items by index."""


def dotted(path: FieldPath) -> str:
    """``metrics[0].name``: keys joined by dots, sequence indices in brackets."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def _short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


MAX_PART = 400
"""Longest field path or problem in a message: a value quoted in it can be anything a file holds
(the longest real problem, a list of known GPU models, is about 200 characters)."""


def _one_line(where: str, field: str, problem: str) -> str:
    """``where: field: problem`` on one line: line breaks escaped, each part cut at MAX_PART."""

    def part(text: str) -> str:
        text = text.replace("\r", "\\r").replace("\n", "\\n")
        return text if len(text) <= MAX_PART else text[: MAX_PART - 1] + "…"

    return f"{where}: {part(field)}: {part(problem)}" if field else f"{where}: {part(problem)}"


class Document:
    """Parsed data plus the line of every mapping key (1-based), by field path."""

    def __init__(
        self,
        data: Any,
        *,
        source: str,
        error: ErrorType,
        lines: Mapping[FieldPath, int] | Callable[[], Mapping[FieldPath, int]] | None = None,
    ) -> None:
        """``lines``: the map, or a function that finds it when a problem is first reported (so
        that a valid document costs no second pass)."""
        self.data = data
        self.source = source
        self.error = error
        self._lines = lines

    @property
    def lines(self) -> Mapping[FieldPath, int]:
        if callable(self._lines):
            self._lines = self._lines()
        return self._lines or {}

    def where(self, path: FieldPath) -> str:
        """``file:line`` of the nearest known line on ``path`` (the key, else its section)."""
        for n in range(len(path), -1, -1):
            line = self.lines.get(path[:n])
            if line is not None:
                return f"{self.source}:{line}"
        return self.source

    def fail(self, path: FieldPath, problem: str, *, field: str | None = None) -> Exception:
        """The one-line error for ``path``; ``field``: the name to show when it is not ``path``
        written as :func:`dotted` (a reader that names fields its own way)."""
        return self.error(_one_line(self.where(path), dotted(path) if field is None else field, problem))

    def root(self, what: str = "the file", *, coerce: bool = False) -> Section:
        """The top-level mapping as a :class:`Section` (``coerce``: see there)."""
        if not isinstance(self.data, dict):
            raise self.error(
                f"{self.where(())}: {what} must be a mapping of fields, got {type(self.data).__name__}"
            )
        return Section(self, self.data, (), coerce=coerce)


def key_lines(node: yaml.Node | None, path: FieldPath = ()) -> dict[FieldPath, int]:
    """The 1-based line of each mapping key under ``node`` (sequence items by their int index).

    Each node is visited once: an alias (``*a``) shares its anchor's node, so a document of nested
    aliases (a "billion laughs") costs its size, not its expansion, and a self-referring alias ends.
    Fields reached only through an alias get the line of the nearest field above them."""
    out: dict[FieldPath, int] = {}
    seen: set[int] = set()
    stack: list[tuple[yaml.Node | None, FieldPath]] = [(node, path)]
    while stack:
        item, at = stack.pop()
        if item is None or id(item) in seen:
            continue
        seen.add(id(item))
        out.setdefault(at, item.start_mark.line + 1)
        if isinstance(item, yaml.MappingNode):
            for key, value in item.value:
                sub = (*at, str(key.value))
                out[sub] = key.start_mark.line + 1
                stack.append((value, sub))
        elif isinstance(item, yaml.SequenceNode):
            stack.extend((child, (*at, i)) for i, child in enumerate(item.value))
    return out


def parse_yaml(text: str, *, source: str, error: ErrorType) -> Document:
    """Parse ``text`` (one YAML document) keeping each key's line; a syntax error is one line."""
    try:
        # one bounded parse (aliases, nesting, control characters, !!tags): the data and its lines
        data, node = yamlsafe.load_with_node(text)
        lines = key_lines(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        problem = getattr(exc, "problem", None) or "not valid YAML"
        raise error(f"{where}: {problem} (YAML syntax)") from None
    return Document(data, source=source, error=error, lines=lines)


def _read(path: Path, *, error: ErrorType, what: str, max_bytes: int = yamlsafe.MAX_BYTES) -> str:
    try:
        return yamlsafe.read_text(path, max_bytes=max_bytes)  # UTF-8 (the bad byte's line named)
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise error(f"{path}: cannot read the {what} ({reason})") from None


def load_yaml(path: Path, *, error: ErrorType, what: str = "file") -> Document:
    return parse_yaml(_read(path, error=error, what=what), source=str(path), error=error)


def json_key_lines(text: str) -> dict[FieldPath, int]:
    """The 1-based line of each object key (and array item) of a valid JSON ``text``.

    Python's JSON decoder keeps no positions, so this walks the text once more with the decoder's
    own string and scalar scanners; it is only called on text that ``json.loads`` accepted."""
    starts = [0] + [i + 1 for i, c in enumerate(text) if c == "\n"]
    out: dict[FieldPath, int] = {}
    decoder = json.JSONDecoder()

    def line(pos: int) -> int:
        return bisect.bisect_right(starts, pos)

    def skip(pos: int) -> int:
        while pos < len(text) and text[pos] in " \t\r\n":
            pos += 1
        return pos

    def value(pos: int, path: FieldPath) -> int:
        pos = skip(pos)
        out.setdefault(path, line(pos))
        if text[pos] == "{":
            pos = skip(pos + 1)
            while text[pos] != "}":
                key, end = decoder.raw_decode(text, pos)
                out[(*path, key)] = line(pos)
                pos = skip(value(skip(end) + 1, (*path, key)))
                pos = skip(pos + 1) if text[pos] == "," else pos
            return pos + 1
        if text[pos] == "[":
            pos, i = skip(pos + 1), 0
            while text[pos] != "]":
                pos = skip(value(pos, (*path, i)))
                pos, i = (skip(pos + 1) if text[pos] == "," else pos), i + 1
            return pos + 1
        return decoder.raw_decode(text, pos)[1]

    value(0, ())
    return out


def parse_json(text: str, *, source: str, error: ErrorType) -> Document:
    """Parse a JSON ``text``; each key's line is found when a problem is reported (the decoder keeps
    none). A syntax error is one line with the decoder's line and column."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{source}:{exc.lineno}: {exc.msg} at column {exc.colno} (JSON syntax)") from None
    except RecursionError:
        raise error(f"{source}: nested too deeply to be a document this program reads") from None
    return Document(data, source=source, error=error, lines=lambda: json_key_lines(text))


def load_json(
    path: Path, *, error: ErrorType, what: str = "file", max_bytes: int = yamlsafe.MAX_BYTES
) -> Document:
    return parse_json(_read(path, error=error, what=what, max_bytes=max_bytes), source=str(path), error=error)


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

    def __init__(self, doc: Document, data: dict[Any, Any], path: FieldPath, *, coerce: bool = False) -> None:
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
