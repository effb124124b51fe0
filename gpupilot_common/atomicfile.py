"""Files written whole or not at all.

Every file the tools write (``plan.json``, the weekly report, the auto-apply ledger, charts) goes
through here: the bytes go to a temporary file in the same directory, are flushed to disk
(``fsync``), and the temporary file is renamed over the target, after which the directory itself is
fsynced so the rename survives a crash. A reader sees the old file or the new one, never half of
one; a full disk or a crash mid-write leaves the old file as it was.

A directory of files (the report: HTML, Markdown, PNG charts) is built in a temporary directory
beside the target and swapped in as a whole by :func:`replace_dir`.

A failure raises :class:`WriteFailed`, an :class:`OSError` whose ``str()`` is one line naming the
file, the cause and that the previous file is intact.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


class WriteFailed(OSError):
    """A file or directory could not be written; the previous one is left as it was."""

    def __init__(self, path: Path, cause: OSError, *, kept: bool, replaced: bool = False) -> None:
        reason = cause.strerror or str(cause) or type(cause).__name__
        if replaced:  # renamed into place, but the directory could not be flushed to disk
            left = "the new file is in place but may not survive a crash"
        else:
            left = "the previous one is left intact" if kept else "nothing was written"
        super().__init__(cause.errno or errno.EIO, f"cannot write {path}: {reason}; {left}")
        self.path = path

    def __str__(self) -> str:
        return str(self.strerror)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def write_bytes(path: Path, data: bytes, *, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` atomically (temporary file, fsync, rename, fsync of the directory).
    The parent directory must exist."""
    write_chunks(path, (data,), mode=mode)


def write_chunks(path: Path, chunks: Iterable[bytes], *, mode: int = 0o644) -> None:
    """:func:`write_bytes` of the chunks' concatenation, each written as it comes (a large file is
    never whole in memory). A chunk's producer raising leaves the previous file intact."""
    path = Path(path)
    existed = path.exists()
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise WriteFailed(path, exc, kept=existed) from exc
    tmp = Path(tmp_name)
    try:
        try:
            for data in chunks:
                _write_all(fd, data)
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise WriteFailed(path, exc, kept=existed) from exc
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    try:
        _fsync_dir(path.parent)
    except OSError as exc:
        raise WriteFailed(path, exc, kept=existed, replaced=True) from exc


def write_text(path: Path, text: str, *, encoding: str = "utf-8") -> None:
    """:func:`write_bytes` for text."""
    write_bytes(path, text.encode(encoding))


@contextlib.contextmanager
def _staging(target: Path) -> Iterator[Path]:
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".new", dir=target.parent))
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _fsync_tree(directory: Path) -> None:
    for item in directory.iterdir():
        if item.is_file():
            fd = os.open(item, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    _fsync_dir(directory)


def replace_dir(target: Path, build: Callable[[Path], T], *, owned: Callable[[str], bool]) -> T:
    """Build a directory's files with ``build(staging_dir)`` in a temporary directory beside
    ``target``, fsync them, then swap it in place of ``target`` (created when missing). When
    ``build`` or the swap fails, ``target`` is left exactly as it was; OS errors are raised as
    :class:`WriteFailed`. Files ``build`` writes into the staging directory may be written plainly:
    nobody sees them before the swap.

    The names ``owned`` accepts (what a previous run wrote) are replaced as a whole; other plain
    files in an existing ``target`` (a plan.json kept beside its report) are carried over into the
    new directory as hard links, unchanged. A ``target`` holding other directories (``--out .``) is
    refused, not touched."""
    target = Path(target)
    existed = target.exists()
    foreign: list[str] = []
    if existed:
        try:
            foreign = sorted(n for n in os.listdir(target) if not owned(n))
            nested = [n for n in foreign if not (target / n).is_file() or (target / n).is_symlink()]
        except OSError as exc:
            raise WriteFailed(target, exc, kept=True) from exc
        if target.resolve() == Path.cwd().resolve():
            nested = ["the current directory"]
        if nested:
            shown = ", ".join(nested[:3]) + (", …" if len(nested) > 3 else "")
            reason = f"it holds directories or links this tool did not write ({shown}); give it a directory of its own"
            raise WriteFailed(target, OSError(errno.EEXIST, reason), kept=True)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with _staging(target) as staging:
            for name in foreign:
                os.link(target / name, staging / name)
            result = build(staging)
            os.chmod(staging, 0o755)  # noqa: S103 - mkdtemp's 0700; a report is there to be read
            _fsync_tree(staging)
            if existed:
                old = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent))
                os.replace(target, old / target.name)
                try:
                    os.replace(staging, target)
                except OSError:
                    os.replace(old / target.name, target)  # put the previous one back
                    raise
                finally:
                    _fsync_dir(target.parent)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(staging, target)
                _fsync_dir(target.parent)
            return result
    except OSError as exc:
        if isinstance(exc, WriteFailed):
            raise
        raise WriteFailed(target, exc, kept=existed) from exc
