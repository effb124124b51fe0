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
  deeper than :data:`MAX_DEPTH`, when its aliases add more than :data:`MAX_ALIAS_VALUES` values to
  what is written out (a few hundred bytes of ``&a [*b, *b, …]`` otherwise stand for billions of
  values), when an alias refers to itself, or when the document itself holds more values than its
  size allows (:func:`document_limit`: a value per :data:`BYTES_PER_VALUE` bytes beyond the first
  :data:`DOCUMENT_FLOOR`, counted while it is read, so the node graph never outgrows the text).

The two sizes are apart on purpose: a scenario of 100,000 pods written out is large because its
file is (about 30 values and 500 bytes a pod), and loads; a small file whose aliases stand for
millions of values does not.

The safe loader only: no Python objects are ever constructed from a file.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml

MAX_BYTES = 16 * 2**20
"""Largest file read (16 MiB): every config, scenario and plan the project reads is far smaller."""
MAX_DEPTH = 64
"""Deepest nesting of sequences and mappings; the deepest real document here is about 8."""
MAX_ALIAS_VALUES = 200_000
"""Most values a document's aliases may add to those written out (each use of an alias counts its
anchor's whole subtree)."""
MAX_NODES = MAX_ALIAS_VALUES
"""The same bound under its earlier name."""
DOCUMENT_FLOOR = 200_000
"""Values any document may hold, however short its text."""
BYTES_PER_VALUE = 4
"""Beyond :data:`DOCUMENT_FLOOR`, a document holds at most a value per this many bytes of text. Every
document the project reads spends more: a scenario about 15 bytes a value, a mig-parted config 6."""


def document_limit(size: int) -> int:
    """Most values (nodes, as written) a document of ``size`` characters may hold."""
    return DOCUMENT_FLOOR + max(0, size) // BYTES_PER_VALUE


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


class _Checks(yaml.composer.Composer):
    """Depth and document size checked per node while the document is composed."""

    def _start_checks(self, size: int) -> None:
        self._depth = 0
        self._values = 0
        self._aliases = 0
        self._size = size
        self._limit = document_limit(size)

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark  # type: ignore[attr-defined]
                raise YamlLimitError(problem=f"nested more than {MAX_DEPTH} levels deep", problem_mark=mark)
            if self.check_event(yaml.AliasEvent):  # type: ignore[attr-defined]
                self._aliases += 1
            else:
                self._values += 1  # a node as written (an alias adds none: check_node counts those)
                if self._values > self._limit:
                    mark = self.peek_event().start_mark  # type: ignore[attr-defined]
                    raise YamlLimitError(
                        problem=f"the document holds more than {self._limit:,} values for its "
                        f"{self._size:,} characters (at most one per {BYTES_PER_VALUE} beyond the first "
                        f"{DOCUMENT_FLOOR:,}); split the file or write fewer, longer values",
                        problem_mark=mark,
                    )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_document(self) -> yaml.Node | None:
        self._values = self._aliases = 0  # each document of a stream is counted on its own
        return super().compose_document()

    def check_aliases(self, node: yaml.Node) -> None:
        """:func:`check_node` for the document just composed; nothing to expand without an alias."""
        if self._aliases:
            check_node(node, written=self._values)


class _BoundedLoader(
    yaml.reader.Reader,
    yaml.scanner.Scanner,
    yaml.parser.Parser,
    _Checks,
    yaml.constructor.SafeConstructor,
    yaml.resolver.Resolver,
):
    """PyYAML's own safe loader (its messages are the ones readers report), with the checks."""

    def __init__(self, stream: str) -> None:
        yaml.reader.Reader.__init__(self, stream)
        yaml.scanner.Scanner.__init__(self)
        yaml.parser.Parser.__init__(self)
        yaml.composer.Composer.__init__(self)
        yaml.constructor.SafeConstructor.__init__(self)
        yaml.resolver.Resolver.__init__(self)
        self._start_checks(len(stream))


_Loader = Any
"""A bounded loader: :class:`_BoundedLoader` or, where PyYAML has libyaml, ``_FastLoader``."""
_FAST: type | None = None
# PyYAML's wheels carry libyaml: its scanner and parser are C, PyYAML's own several times slower.
if yaml.__with_libyaml__:
    from yaml._yaml import CParser

    class _FastLoader(_Checks, CParser, yaml.constructor.SafeConstructor, yaml.resolver.Resolver):
        """libyaml's events composed in Python with the same checks. A text libyaml refuses is read
        again by :class:`_BoundedLoader`, so every syntax error is reported in PyYAML's words."""

        def __init__(self, stream: str) -> None:
            CParser.__init__(self, stream)
            yaml.composer.Composer.__init__(self)
            yaml.constructor.SafeConstructor.__init__(self)
            yaml.resolver.Resolver.__init__(self)
            self._start_checks(len(stream))

    _FAST = _FastLoader

_T = TypeVar("_T")


def _parsed(text: str, read: Callable[[_Loader], _T]) -> _T:
    """``read`` over a bounded loader of ``text``: libyaml's parser first where there is one, PyYAML's
    own when libyaml refuses the text (its verdict and message are the reader's)."""
    if _FAST is not None:
        try:
            fast = _FAST(text)
        except yaml.reader.ReaderError:
            pass
        else:
            try:
                return read(fast)
            except (yaml.scanner.ScannerError, yaml.parser.ParserError, yaml.reader.ReaderError):
                pass  # PyYAML's reader decides, in its own words
            finally:
                fast.dispose()
    loader = _open(text)
    try:
        return read(loader)
    except yaml.reader.ReaderError as exc:
        raise _reader_error(exc, text) from None
    finally:
        loader.dispose()


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _written(node: yaml.Node) -> int:
    """Distinct nodes of a composed document (each alias target once)."""
    seen: set[int] = set()
    stack = [node]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        stack.extend(c for c in _children(current) if id(c) not in seen)
    return len(seen)


def check_node(node: yaml.Node, *, written: int | None = None) -> None:
    """Refuse a composed document whose aliases add more than :data:`MAX_ALIAS_VALUES` values to
    those written out, or loop.

    Counts each node once per place it appears (an alias counts its anchor's whole subtree),
    bottom-up with a memo, so checking costs the document's size, not its expansion. A subtree
    standing for more values than the whole document writes out plus the allowance is the
    earliest (deepest) place where the aliases' expansion shows; the whole document's expansion
    passes exactly when its aliases add at most the allowance. ``written``: the document's distinct
    nodes, when the caller counted them."""
    cap = (_written(node) if written is None else written) + MAX_ALIAS_VALUES
    sizes: dict[int, int] = {}
    active: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(node, False)]
    while stack:
        current, finished = stack.pop()
        key = id(current)
        children = _children(current)
        if finished:
            total = 1 + sum(sizes[id(c)] for c in children)
            if total > cap:
                raise YamlLimitError(
                    problem=f"aliases expand to more than {MAX_ALIAS_VALUES:,} values; write the data out "
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


def _construct(loader: _Loader, node: yaml.Node) -> Any:
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

    def read(loader: _Loader) -> list[yaml.Node]:
        nodes: list[yaml.Node] = []
        while loader.check_node():
            node = loader.get_node()
            if node is not None:  # check_node() said a document follows
                loader.check_aliases(node)
                nodes.append(node)
        return nodes

    return _parsed(text, read)


def safe_load_all(text: str) -> list[Any]:
    """Every document as plain Python data (``yaml.safe_load_all``, bounded)."""

    def read(loader: _Loader) -> list[Any]:
        docs: list[Any] = []
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                docs.append(None)
                continue
            loader.check_aliases(node)
            docs.append(_construct(loader, node))
        return docs

    return _parsed(text, read)


def safe_load(text: str) -> Any:
    """The single document as plain Python data (``yaml.safe_load``, bounded)."""
    return load_with_node(text)[0]


def load_with_node(text: str) -> tuple[Any, yaml.Node | None]:
    """The single document as plain Python data and its checked node graph (whose marks give the
    line of every key), from one bounded parse."""

    def read(loader: _Loader) -> tuple[Any, yaml.Node | None]:
        node = loader.get_single_node()
        if node is None:
            return None, None
        loader.check_aliases(node)
        return _construct(loader, node), node

    return _parsed(text, read)


def load_all_with_nodes(text: str) -> list[tuple[Any, yaml.Node | None]]:
    """Every document as plain Python data with its checked node graph (whose marks give line
    numbers), for large files read often (the MIG Manager's mig-parted config): the same parse and
    limits as :func:`safe_load_all`."""

    def read(loader: _Loader) -> list[tuple[Any, yaml.Node | None]]:
        out: list[tuple[Any, yaml.Node | None]] = []
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                out.append((None, None))
                continue
            loader.check_aliases(node)
            out.append((_construct(loader, node), node))
        return out

    return _parsed(text, read)
