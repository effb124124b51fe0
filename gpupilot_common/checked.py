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
read ``metrics[0].name``; readers that build paths as text use :meth:`Document.fail_dotted`.
Users: the adapter config, the simulator's scenarios, the exporter's web config, ``rightsizer
serve``'s config and plan.json.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from gpupilot_common import yamlsafe
from gpupilot_common.timefmt import parse_duration

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
        self._by_text: dict[str, int] | None = None

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

    def fail_dotted(self, field: str, problem: str) -> Exception:
        """The one-line error for a field named in :func:`dotted` form (``nodes[2].gpus[0].mig``),
        for readers that build their paths as text; the line is that of the nearest known field."""
        if self._by_text is None:
            self._by_text = {dotted(p): line for p, line in self.lines.items()}
        probe = field
        while probe and probe not in self._by_text:
            probe = probe[: max(probe.rfind("."), probe.rfind("["), 0)]
        line = self._by_text.get(probe)
        where = f"{self.source}:{line}" if line is not None else self.source
        return self.error(_one_line(where, field, problem))

    def root(self, what: str = "the file") -> Section:
        if not isinstance(self.data, dict):
            raise self.error(
                f"{self.where(())}: {what} must be a mapping of fields, got {type(self.data).__name__}"
            )
        return Section(self, self.data, ())


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


class Section:
    """A mapping at ``path`` of a :class:`Document`; each getter checks one field."""

    def __init__(self, doc: Document, data: dict[Any, Any], path: FieldPath) -> None:
        self.doc, self.data, self.path = doc, data, path

    def __contains__(self, key: str) -> bool:
        return key in self.data

    def fail(self, key: str, problem: str) -> Exception:
        return self.doc.fail((*self.path, key), problem)

    def keys(self, allowed: Iterable[str]) -> None:
        known = tuple(allowed)
        for key in self.data:
            if key not in known:
                raise self.fail(str(key), f"unknown field (known: {', '.join(known)})")

    def raw(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    def text(self, key: str, default: str | None = None) -> str:
        v = self.data.get(key, default)
        if not isinstance(v, str) or not v:
            raise self.fail(
                key, "required, a non-empty string" if v is None else f"must be a string, got {_short(v)}"
            )
        return v

    def optional_text(self, key: str) -> str | None:
        return None if self.data.get(key) is None else self.text(key)

    def boolean(self, key: str, default: bool) -> bool:
        v = self.data.get(key, default)
        if not isinstance(v, bool):
            raise self.fail(key, f"must be true or false, got {_short(v)}")
        return v

    def integer(
        self, key: str, default: int | None, *, minimum: int = 0, maximum: int | None = None
    ) -> int | None:
        v = self.data.get(key, default)
        if v is None:
            return None
        if (
            isinstance(v, bool)
            or not isinstance(v, int)
            or v < minimum
            or (maximum is not None and v > maximum)
        ):
            bound = f"from {minimum} to {maximum}" if maximum is not None else f">= {minimum}"
            raise self.fail(key, f"must be a whole number {bound}, got {_short(v)}")
        return v

    def number(
        self, key: str, default: float | None, *, minimum: float = 0.0, maximum: float | None = None
    ) -> float | None:
        v = self.data.get(key, default)
        if v is None:
            return None
        if (
            isinstance(v, bool)
            or not isinstance(v, int | float)
            or not math.isfinite(v)
            or v < minimum
            or (maximum is not None and v > maximum)
        ):
            bound = f"from {minimum:g} to {maximum:g}" if maximum is not None else f">= {minimum:g}"
            raise self.fail(key, f"must be a number {bound}, got {_short(v)}")
        return float(v)

    def duration(self, key: str, default: float, *, minimum: float = 0.0) -> float:
        """A duration in Prometheus' grammar (``90s``, ``1h30m``, ``7d``), in seconds."""
        v = self.data.get(key)
        if v is None:
            return default
        try:
            seconds = parse_duration(str(v))
        except ValueError as exc:
            raise self.fail(key, str(exc)) from None
        if seconds < minimum:
            raise self.fail(key, f"must be at least {minimum:g}s, got {v}")
        return seconds

    def sequence(self, key: str) -> list[Any]:
        """The list under ``key`` (empty when absent or null)."""
        v = self.data.get(key)
        if v is None:
            return []
        if not isinstance(v, list):
            raise self.fail(key, f"must be a list, got {_short(v)}")
        return v

    def sections(self, key: str, *, what: str = "a mapping of fields") -> list[Section]:
        """The list of mappings under ``key``, each a :class:`Section` at ``key[i]``."""
        out: list[Section] = []
        for i, item in enumerate(self.sequence(key)):
            path = (*self.path, key, i)
            if not isinstance(item, dict):
                raise self.doc.fail(path, f"must be {what}, got {_short(item)}")
            out.append(Section(self.doc, item, path))
        return out

    def section(self, key: str) -> Section | None:
        """The mapping under ``key`` (None when absent or null)."""
        v = self.data.get(key)
        if v is None:
            return None
        if not isinstance(v, dict):
            raise self.fail(key, f"must be a mapping of fields, got {_short(v)}")
        return Section(self.doc, v, (*self.path, key))
