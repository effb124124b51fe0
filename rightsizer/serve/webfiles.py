"""``serve``'s read-only file routes: the latest weekly report and the latest plan over HTTP.

* ``/plan.json`` — the plan the plan job wrote last (``<state_dir>/plan.json``);
* ``/report/`` — ``report.html`` of the newest dated report folder (``<out_dir>/YYYY-MM-DD``), and
  ``/report/NAME`` the other files of that folder (its charts, ``report.md``), so the page's
  relative links work;
* ``/reports/`` — the dated folders, newest first; ``/reports/DATE/`` and ``/reports/DATE/NAME``
  an older report.

Only plain files directly inside a report folder are served: a name is one path segment of
letters, digits, ``.``, ``_`` and ``-`` not starting with a dot (no ``..``, no ``/``, no hidden
files), a symbolic link is refused, and a file larger than ``max_bytes`` is refused rather than
read. Content types come from a fixed table by suffix.
"""

from __future__ import annotations

import html
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from gpupilot_common.httpserve import Reply

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

    def answer(self, path: str) -> Reply:
        if path == "/plan.json":
            return self._file(self.plan_path, missing="no plan yet: the plan job has not written one")
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

    def _dated(self, rest: str) -> Reply:
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

    def _in(self, folder: Path, name: str) -> Reply:
        name = name or INDEX
        if not NAME.fullmatch(name):
            return _text(404, "not found: a report file is one name of letters, digits, '.', '_' and '-'")
        return self._file(folder / name, missing=f"not found: {name}")

    def _file(self, path: Path, *, missing: str) -> Reply:
        # One open that follows no symbolic link and never waits (a FIFO put in the file's place),
        # then checks on what was opened: nothing can be swapped in between a check and the read.
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return _text(404, missing)
        with os.fdopen(fd, "rb") as f:
            try:
                info = os.fstat(fd)
                if not stat.S_ISREG(info.st_mode):  # a folder, a device, a FIFO: never read
                    return _text(404, missing)
                if info.st_size > self.max_bytes:
                    return _text(
                        500, f"{path.name} is larger than {self.max_bytes} bytes; read it from the volume"
                    )
                body = f.read(self.max_bytes + 1)  # it may have grown since fstat
            except OSError as exc:
                return _text(500, f"cannot read {path.name}: {exc.strerror or exc}")
        if len(body) > self.max_bytes:
            return _text(500, f"{path.name} is larger than {self.max_bytes} bytes; read it from the volume")
        return Reply(200, body, CONTENT_TYPES.get(path.suffix, "application/octet-stream"))
