"""One way to read checked input: a YAML (or JSON) document read once, then typed getters on its
sections that fail with ONE line, ``file:line: field.path: problem`` (``source: field.path: problem`` for data
that came from no file, such as a test's dict).

Each service keeps its own error tree: the reader is given the exception class to raise (a
``ServeConfigError``, the exporter's ``ConfigError``), so callers catch what they always caught.

    doc = checked.load_yaml(path, error=ServeConfigError)
    top = doc.root()                      # a section.Section over the top-level mapping
    top.keys(("listen", "plan"))          # unknown fields: one line naming the known ones
    every = top.section("plan").duration("every", default=6 * 3600, minimum=60)

Lines come from the YAML composer's marks (the line of the key, or of the section when the key is
missing), so a problem is found in the file where the reader would look for it; they are found
(for YAML and JSON alike) from the text when the first problem is reported, so a valid document
costs one parse and no map of lines. Field paths
read ``metrics[0].name``.
Users: the adapter config, the simulator's scenarios, the exporter's web config, ``rightsizer
serve``'s config and plan.json.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from gpupilot_common import yamlsafe
from gpupilot_common.fieldpath import FieldPath, dotted
from gpupilot_common.section import Section

ErrorType = Callable[[str], Exception]

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
        """The top-level mapping as a :class:`~gpupilot_common.section.Section` (``coerce``: see there)."""
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
        # one bounded parse (aliases, nesting, control characters, !!tags); the lines of its keys are
        # found again from the text when a problem is first reported: a scenario of 100,000 pods
        # would otherwise keep a line for each of its millions of values
        data, _node = yamlsafe.load_with_node(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        problem = getattr(exc, "problem", None) or "not valid YAML"
        raise error(f"{where}: {problem} (YAML syntax)") from None
    return Document(data, source=source, error=error, lines=lambda: _yaml_lines(text))


def _yaml_lines(text: str) -> dict[FieldPath, int]:
    nodes = yamlsafe.compose_all(text)  # the text was read once already: it parses
    return key_lines(nodes[0] if nodes else None)


def _read(path: Path, *, error: ErrorType, what: str, max_bytes: int = yamlsafe.MAX_BYTES) -> str:
    try:
        return yamlsafe.read_text(path, max_bytes=max_bytes)  # UTF-8 (the bad byte's line named)
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise error(f"{path}: cannot read the {what} ({reason})") from None


def load_yaml(
    path: Path, *, error: ErrorType, what: str = "file", max_bytes: int = yamlsafe.MAX_BYTES
) -> Document:
    return parse_yaml(_read(path, error=error, what=what, max_bytes=max_bytes), source=str(path), error=error)


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
