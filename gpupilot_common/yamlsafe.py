"""YAML and text files read with bounds, for every reader of user files in the project.

Drop-in replacements for ``Path.read_text``, ``yaml.safe_load``, ``yaml.safe_load_all`` and
``yaml.compose_all`` that fail the way each reader already reports failures, so its one-line
message format stays its own:

* :func:`read_text` and :func:`read_bytes` raise :class:`UnreadableFile`, an ``OSError`` whose
  ``strerror`` says what is wrong (not UTF-8 and where, larger than the limit, a named pipe, a
  device or a directory where a file is expected, a NUL in the path), for the reader's
  ``except OSError``.
* The loaders raise :class:`YamlLimitError`, a ``yaml.MarkedYAMLError`` with ``problem`` and
  ``problem_mark`` (line) set, for the reader's ``except yaml.YAMLError``, when a document nests
  deeper than :data:`MAX_DEPTH`, when its aliases expand to more than :data:`MAX_NODES` nodes (a
  few hundred bytes of ``&a [*b, *b, …]`` otherwise stand for billions of values), or when an
  alias refers to itself.

The safe loader only: no Python objects are ever constructed from a file.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import yaml

MAX_BYTES = 16 * 2**20
"""Largest file read (16 MiB): every config, scenario and plan the project reads is far smaller."""
MAX_DEPTH = 64
"""Deepest nesting of sequences and mappings; the deepest real document here is about 8."""
MAX_NODES = 200_000
"""Most nodes one document may stand for once its aliases are expanded."""


class UnreadableFile(OSError):
    """A file that cannot be read as text; an ``OSError`` so that readers report it as such."""


class YamlLimitError(yaml.MarkedYAMLError):
    """A document over a limit: too deep, too large once aliases are expanded, or recursive."""


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def read_bytes(path: Path, *, max_bytes: int = MAX_BYTES) -> bytes:
    """The file's bytes, at most ``max_bytes``; :class:`UnreadableFile` (or the ``OSError`` of opening
    it) otherwise. Only a regular file is read: a named pipe (which would block the reader for ever),
    a device or a directory given where a file is expected is refused at once, and so is a path the
    system cannot represent (a NUL character)."""
    try:
        # O_NONBLOCK: opening a named pipe waits for a writer; with it, the open returns at once
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except ValueError:  # "embedded null byte"
        raise UnreadableFile(
            0, "the path holds a NUL character; give a file name without one", str(path)
        ) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
            raise UnreadableFile(0, f"{kind}, not a regular file; give a file", str(path))
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=True) as f:
            fd = -1
            data = f.read(max_bytes + 1)
    finally:
        if fd >= 0:
            os.close(fd)
    if len(data) > max_bytes:
        raise UnreadableFile(0, f"larger than {max_bytes // 2**20} MiB; is this the right file?", str(path))
    return data


def read_text(path: Path, *, max_bytes: int = MAX_BYTES) -> str:
    """The file as UTF-8 text; :class:`UnreadableFile` (or the ``OSError`` of opening it) otherwise
    (only a regular file, see :func:`read_bytes`)."""
    data = read_bytes(path, max_bytes=max_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise UnreadableFile(
            0,
            f"not UTF-8 text (byte 0x{data[exc.start]:02x} on line {line}); save the file as UTF-8",
            str(path),
        ) from None


class _BoundedLoader(yaml.SafeLoader):
    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise YamlLimitError(problem=f"nested more than {MAX_DEPTH} levels deep", problem_mark=mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def check_node(node: yaml.Node) -> None:
    """Refuse a composed document whose aliases expand beyond :data:`MAX_NODES` or loop.

    Counts each node once per place it appears (an alias counts its anchor's whole subtree),
    bottom-up with a memo, so checking costs the document's size, not its expansion."""
    sizes: dict[int, int] = {}
    active: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(node, False)]
    while stack:
        current, finished = stack.pop()
        key = id(current)
        children = _children(current)
        if finished:
            total = 1 + sum(sizes[id(c)] for c in children)
            if total > MAX_NODES:
                raise YamlLimitError(
                    problem=f"aliases expand to more than {MAX_NODES:,} values; write the data out "
                    "or use fewer nested aliases",
                    problem_mark=current.start_mark,
                )
            sizes[key] = total
            active.discard(key)
            continue
        if key in sizes:
            continue
        if key in active:
            raise YamlLimitError(problem="an alias refers to itself", problem_mark=current.start_mark)
        active.add(key)
        stack.append((current, True))
        stack.extend((c, False) for c in children if id(c) not in sizes)


def _reader_error(exc: yaml.reader.ReaderError, text: str) -> YamlLimitError:
    """PyYAML's reader error (a control character) with a line, like every other YAML error."""
    position = exc.position if isinstance(exc.position, int) else 0
    line = text.count("\n", 0, position)
    mark = yaml.Mark("<text>", position, line, 0, None, 0)
    return YamlLimitError(
        problem=f"character 0x{exc.character:x} is not allowed in YAML"
        if isinstance(exc.character, int)
        else "not YAML text",
        problem_mark=mark,
    )


def _open(text: str) -> _BoundedLoader:
    try:
        return _BoundedLoader(text)
    except yaml.reader.ReaderError as exc:  # PyYAML checks every character up front
        raise _reader_error(exc, text) from None


def _construct(loader: _BoundedLoader, node: yaml.Node) -> Any:
    try:
        return loader.construct_document(node)
    except yaml.YAMLError:
        raise
    except Exception as exc:  # e.g. ``!!int x`` or ``!!int`` alone: PyYAML raises ValueError, IndexError
        raise yaml.constructor.ConstructorError(
            problem=f"a tagged value cannot be read ({type(exc).__name__}); remove the !!tag or fix the value",
            problem_mark=node.start_mark,
        ) from None


def compose_all(text: str) -> list[yaml.Node]:
    """Every document's node graph, checked (``yaml.compose_all``, bounded)."""
    loader = _open(text)
    try:
        nodes: list[yaml.Node] = []
        while loader.check_node():
            node = loader.get_node()
            if node is not None:  # check_node() said a document follows
                check_node(node)
                nodes.append(node)
        return nodes
    except yaml.reader.ReaderError as exc:
        raise _reader_error(exc, text) from None
    finally:
        loader.dispose()


def safe_load_all(text: str) -> list[Any]:
    """Every document as plain Python data (``yaml.safe_load_all``, bounded)."""
    loader = _open(text)
    try:
        docs: list[Any] = []
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                docs.append(None)
                continue
            check_node(node)
            docs.append(_construct(loader, node))
        return docs
    except yaml.reader.ReaderError as exc:
        raise _reader_error(exc, text) from None
    finally:
        loader.dispose()


def safe_load(text: str) -> Any:
    """The single document as plain Python data (``yaml.safe_load``, bounded)."""
    return load_with_node(text)[0]


def load_with_node(text: str) -> tuple[Any, yaml.Node | None]:
    """The single document as plain Python data and its checked node graph (whose marks give the
    line of every key), from one bounded parse."""
    loader = _open(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, None
        check_node(node)
        return _construct(loader, node), node
    except yaml.reader.ReaderError as exc:
        raise _reader_error(exc, text) from None
    finally:
        loader.dispose()


_FastLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's safe loader when PyYAML was built with it (about 10x faster on large files); its
scanner refuses nesting past its own depth limit, so composing never recurses without bound."""


def _height(node: yaml.Node) -> int:
    """Levels of nesting under and including ``node`` (aliases followed; :func:`check_node` has
    refused loops), bottom-up with a memo, so it costs the document's size."""
    heights: dict[int, int] = {}
    stack: list[tuple[yaml.Node, bool]] = [(node, False)]
    while stack:
        current, finished = stack.pop()
        children = _children(current)
        if finished:
            heights[id(current)] = 1 + max((heights[id(c)] for c in children), default=0)
            continue
        if id(current) in heights:
            continue
        stack.append((current, True))
        stack.extend((c, False) for c in children if id(c) not in heights)
    return heights[id(node)]


def load_all_with_nodes(text: str) -> list[tuple[Any, yaml.Node | None]]:
    """Every document as plain Python data with its checked node graph (whose marks give line
    numbers), composed by libyaml where available: the same limits as :func:`safe_load_all`
    (:data:`MAX_DEPTH`, :data:`MAX_NODES`, no alias to itself), for large files read often (the MIG
    Manager's mig-parted config)."""
    try:
        nodes = list(yaml.compose_all(text, Loader=_FastLoader))
    except yaml.reader.ReaderError as exc:
        raise _reader_error(exc, text) from None
    out: list[tuple[Any, yaml.Node | None]] = []
    loader = yaml.SafeLoader("")
    try:
        for node in nodes:
            if node is None:
                out.append((None, None))
                continue
            check_node(node)
            if _height(node) > MAX_DEPTH:
                raise YamlLimitError(
                    problem=f"nested more than {MAX_DEPTH} levels deep", problem_mark=node.start_mark
                )
            out.append((_construct(loader, node), node))  # type: ignore[arg-type]
    finally:
        loader.dispose()
    return out
