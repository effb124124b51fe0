"""``serve``'s read-only file routes: the latest weekly report and the latest plan over HTTP.

* ``/plan.json`` — the plan the plan job wrote last (``<state_dir>/plan.json``);
* ``/report/`` — ``report.html`` of the newest dated report folder (``<out_dir>/YYYY-MM-DD``), and
  ``/report/NAME`` the other files of that folder (its charts, ``report.md``), so the page's
  relative links work;
* ``/reports/`` — the dated folders, newest first; ``/reports/DATE/`` and ``/reports/DATE/NAME``
  an older report.

Only plain files directly inside a report folder are served: a name is one path segment of
letters, digits, ``.``, ``_`` and ``-`` not starting with a dot (no ``..``, no ``/``, no hidden
files). Files are opened from the report directory down, one component at a time relative to the
one before (``openat`` with ``O_NOFOLLOW``): a symbolic link anywhere below the directory — the
date folder swapped for one between a check and the open included — is refused, and so is a file
with more than one hard link (it may be a file from elsewhere linked in). A file larger than
``max_bytes`` is refused rather than sent. Files are answered as :class:`FileReply` (sent in chunks
as the client reads). Content types come from a fixed table by suffix.
"""

from __future__ import annotations

import html
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from gpupilot_common.httpserve import FileReply, Reply

CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".md": "text/markdown; charset=utf-8",
    ".png": "image/png",
    ".svg": "image/svg+xml",
    ".csv": "text/csv; charset=utf-8",
    ".json": "application/json",
    ".txt": "text/plain; charset=utf-8",
}
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
INDEX = "report.html"
MAX_BYTES = 32 << 20
"""A report's charts are a few hundred kilobytes; a plan of 10,000 nodes a few megabytes."""


def _text(status: int, message: str) -> Reply:
    return Reply(status, (message + "\n").encode())


@dataclass(frozen=True)
class ReportFiles:
    reports_dir: Path
    """Where the report job writes its dated folders (``report.out_dir`` or ``<state_dir>/reports``)."""
    plan_path: Path
    """The plan job's ``plan.json``."""
    max_bytes: int = MAX_BYTES

    def handles(self, path: str) -> bool:
        return (
            path == "/plan.json"
            or path in ("/report", "/reports")
            or path.startswith(("/report/", "/reports/"))
        )

    def answer(self, path: str) -> Reply | FileReply:
        if path == "/plan.json":
            return self._file(
                self.plan_path.parent,
                (self.plan_path.name,),
                missing="no plan yet: the plan job has not written one",
            )
        if path in ("/report", "/reports"):
            target = path + "/"
            link = f'<a href="{target}">{target}</a>'
            return Reply(
                200,
                f"<!doctype html><title>gpupilot</title><p>See {link}</p>\n".encode(),
                CONTENT_TYPES[".html"],
            )
        if path.startswith("/reports/"):
            return self._dated(path.removeprefix("/reports/"))
        latest = self.latest()
        if latest is None:
            return _text(
                404,
                "no report yet: serve writes the first one after its first plan, minutes after it "
                "starts (then weekly); /health shows a report or plan job that fails",
            )
        return self._in(latest, path.removeprefix("/report/"))

    def dated(self) -> list[Path]:
        """Report folders holding a report, newest first."""
        try:
            entries = list(self.reports_dir.iterdir())
        except OSError:
            return []
        found = [
            p for p in entries if DATE.fullmatch(p.name) and not p.is_symlink() and (p / INDEX).is_file()
        ]
        return sorted(found, key=lambda p: p.name, reverse=True)

    def latest(self) -> Path | None:
        dated = self.dated()
        return dated[0] if dated else None

    def _dated(self, rest: str) -> Reply | FileReply:
        if not rest:
            items = "".join(f'<li><a href="{d.name}/">{d.name}</a></li>' for d in self.dated())
            body = f"<!doctype html><title>gpupilot reports</title><h1>Reports</h1><ul>{items}</ul>\n"
            return Reply(200, body.encode(), CONTENT_TYPES[".html"])
        day, _, name = rest.partition("/")
        if not DATE.fullmatch(day):
            return _text(404, f"not found: {html.escape(day)!r} is not a report date (YYYY-MM-DD)")
        folder = self.reports_dir / day
        if folder not in self.dated():
            return _text(404, f"no report for {day}")
        return self._in(folder, name)

    def _in(self, folder: Path, name: str) -> Reply | FileReply:
        name = name or INDEX
        if not NAME.fullmatch(name):
            return _text(404, "not found: a report file is one name of letters, digits, '.', '_' and '-'")
        return self._file(self.reports_dir, (folder.name, name), missing=f"not found: {name}")

    def _file(self, base: Path, parts: tuple[str, ...], *, missing: str) -> Reply | FileReply:
        """``base/parts...`` opened without following a link below ``base`` and never waiting (a FIFO
        put in the file's place), then checked on what was opened: nothing can be swapped in between
        a check and the read."""
        name = parts[-1]
        try:
            fd = open_below(base, parts)
        except OSError:
            return _text(404, missing)
        f = os.fdopen(fd, "rb")
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):  # a folder, a device, a FIFO: never read
                f.close()
                return _text(404, missing)
            if info.st_nlink != 1:  # linked in from elsewhere (a hard link shares the inode)
                f.close()
                return _text(404, f"{missing} (a file with more than one hard link is not served)")
            if info.st_size > self.max_bytes:
                f.close()
                return _text(500, f"{name} is larger than {self.max_bytes} bytes; read it from the volume")
        except OSError as exc:
            f.close()
            return _text(500, f"cannot read {name}: {exc.strerror or exc}")
        suffix = Path(name).suffix
        return FileReply(f, info.st_size, CONTENT_TYPES.get(suffix, "application/octet-stream"))


def open_below(base: Path, parts: tuple[str, ...]) -> int:
    """A read-only descriptor of ``base/parts[0]/.../parts[-1]``, each component opened relative to
    the one before with ``O_NOFOLLOW`` (``base`` itself is the configured directory and may be
    reached through links). OSError when a component is missing or a symbolic link."""
    here = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            below = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=here)
            os.close(here)
            here = below
        return os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=here)
    finally:
        os.close(here)
