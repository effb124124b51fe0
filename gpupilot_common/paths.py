"""Checks on paths that a user typed: never an exception, whatever the text."""

from __future__ import annotations

from pathlib import Path


def is_file(path: Path) -> bool:
    """Whether ``path`` names a regular file now. ``Path.is_file`` raises for a name the system will
    not look up (longer than the file system allows, a parent without search permission) instead of
    answering False; a path given in a flag or a config file must be refused in one line, not end
    the command in a traceback."""
    try:
        return path.is_file()
    except OSError:
        return False


def exists(path: Path) -> bool:
    """Whether anything is at ``path`` now (a socket, a file, a directory); False, not an exception,
    for a name the system will not look up (see :func:`is_file`)."""
    try:
        return path.exists()
    except OSError:
        return False
