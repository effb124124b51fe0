"""Report retention: after each report, the dated report folders beyond ``report.retention`` go.

``count`` keeps the newest N folders, ``max_age`` removes folders whose date is older than that
(both may be set; a folder goes when either says so). The folder just written is never removed,
nor anything that is not a dated report folder (``YYYY-MM-DD`` holding ``report.html``) or that is
a symbolic link. A folder that cannot be removed is logged and tried again after the next report.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path

from gpupilot_common import logs
from rightsizer.serve import webfiles

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Retention:
    count: int | None = None
    """Newest dated report folders kept (None: no count limit)."""
    max_age_s: float | None = None
    """Folders dated more than this before today go (None: no age limit)."""


def doomed(folders: list[Path], keep: Retention, *, today: date, written: Path | None) -> list[Path]:
    """Which of ``folders`` (newest first, as :meth:`ReportFiles.dated` lists them) go."""
    out = []
    for i, folder in enumerate(folders):
        if written is not None and folder.name == written.name:
            continue
        too_many = keep.count is not None and i >= keep.count
        too_old = False
        if keep.max_age_s is not None:
            try:
                too_old = date.fromisoformat(folder.name) < today - timedelta(seconds=keep.max_age_s)
            except ValueError:  # matched the pattern but is no date (2026-13-40): never removed
                too_old = False
        if too_many or too_old:
            out.append(folder)
    return out


def prune(reports_dir: Path, keep: Retention, *, today: date, written: Path | None = None) -> list[str]:
    """Remove the folders ``keep`` does not keep; the names removed."""
    if keep.count is None and keep.max_age_s is None:
        return []
    folders = webfiles.ReportFiles(reports_dir, reports_dir / "plan.json").dated()
    removed = []
    for folder in doomed(folders, keep, today=today, written=written):
        try:
            shutil.rmtree(folder)
        except OSError as exc:
            log.warning(
                "could not remove old report folder %s: %s",
                folder,
                exc.strerror or exc,
                extra=logs.fields(folder=str(folder)),
            )
            continue
        removed.append(folder.name)
    if removed:
        log.info(
            "report retention removed %d old report folder(s): %s",
            len(removed),
            ", ".join(removed),
            extra=logs.fields(removed=len(removed)),
        )
    return removed
