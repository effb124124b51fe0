"""Checks on paths that a user typed: never an exception, whatever the text."""

from __future__ import annotations

import os
import stat
from pathlib import Path

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def is_file(path: Path) -> bool:
    """Whether ``path`` names a regular file now. ``Path.is_file`` raises for a name the system will
    not look up (longer than the file system allows, a parent without search permission, a NUL
    character) instead of answering False; a path given in a flag or a config file must be refused
    in one line, not end the command in a traceback."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def exists(path: Path) -> bool:
    """Whether anything is at ``path`` now (a socket, a file, a directory); False, not an exception,
    for a name the system will not look up (see :func:`is_file`)."""
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


def file_problem(path: Path) -> str:
    """Why ``path`` is not a regular file to read ("" when it is): no such file, a named pipe (which
    would block its reader for ever), a device, a directory, a NUL character in the name."""
    if "\0" in str(path):
        return "the path holds a NUL character"
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "no such file"
    except (OSError, ValueError) as exc:  # a name too long to look up, a parent without search right
        return f"no such file ({getattr(exc, 'strerror', None) or exc})"
    if stat.S_ISREG(mode):
        return ""
    kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
    return f"{kind}, not a regular file"


def name_problem(path: Path) -> str:
    """Why ``path`` cannot name anything on this system ("" when it can): a NUL character, or a
    name the file system encoding cannot represent (a lone surrogate)."""
    text = str(path)
    if "\0" in text:
        return "holds a NUL character"
    try:
        os.fsencode(text)
    except UnicodeError:
        return "holds a character the file system cannot represent"
    return ""
