"""After each weekly report: an optional push, to a webhook (Slack-compatible, or the figures as
JSON) and/or a copy of the report folder to an archive path (an object store mounted as a volume).

The report is written first and stays whatever the push does: a failed push is tried again (three
tries over about a minute), then counted (``gpupilot_rightsizer_report_pushes_total{target,result}``,
the ``GPURightsizerReportPushFailing`` alert) and logged in one line without the webhook's URL."""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpupilot_common import atomicfile, logs
from rightsizer.clients import webhook
from rightsizer.errors import RightsizerError

log = logging.getLogger(__name__)

TRIES = 3
PAUSES_S = (10.0, 45.0)
FORMATS = ("slack", "json")


@dataclass(frozen=True)
class ReportPush:
    webhook_url_file: Path | None = None
    """A file holding the webhook's URL (a mounted Secret); None: no webhook."""
    format: str = "slack"
    """``slack``: ``{"text": …}`` (Slack, Mattermost, Rocket.Chat, Google Chat); ``json``: the figures."""
    link: str = ""
    """Where people open the reports (an Ingress to serve's /report/), put in the message."""
    copy_to: Path | None = None
    """A directory each report folder is copied to (``<copy_to>/<date>/``); None: no copy."""
    timeout_s: float = 10.0


def message(figures: dict[str, Any], *, folder: str, link: str) -> str:
    """The one-paragraph chat message: what to look at, and where."""
    cost = figures.get("cost_per_week")
    money = f", {cost:,.0f} saved per week" if isinstance(cost, int | float) else ""
    where = f" {link.rstrip('/')}/{folder}/report.html" if link else ""
    return (
        f"GPU rightsizing report {folder}: {figures.get('idle_allocated', 0)} allocated device(s) idle all "
        f"window, {figures.get('unallocated', 0)} idle device(s) no pod holds; the plan frees "
        f"{figures.get('gpus_freed', 0)} GPU(s) ({figures.get('gpu_hours_per_week', 0):,.0f} GPU-hours per "
        f"week{money}).{where}"
    )


def _copy(folder: Path, archive: Path) -> None:
    def build(staging: Path) -> None:
        for item in folder.iterdir():
            if item.is_file() and not item.is_symlink():
                shutil.copyfile(item, staging / item.name)

    atomicfile.replace_dir(archive / folder.name, build, owned=lambda _name: True)


def _tried(what: str, fn: Callable[[], None], *, sleep: Callable[[float], None]) -> str:
    """ "" when ``fn`` succeeded within :data:`TRIES`, else the last error (one line)."""
    last = ""
    for attempt in range(TRIES):
        try:
            fn()
            return ""
        except (RightsizerError, atomicfile.WriteFailed, OSError) as exc:
            last = " ".join(str(exc).split()) or type(exc).__name__
            log.debug("report push to %s failed (try %d of %d): %s", what, attempt + 1, TRIES, last)
        if attempt < len(PAUSES_S):
            sleep(PAUSES_S[attempt])
    return last


def push(
    folder: Path,
    figures: dict[str, Any],
    settings: ReportPush,
    *,
    record: Callable[[str, str], None],
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Push the report in ``folder`` as ``settings`` say; ``record(target, result)`` counts each."""
    if settings.webhook_url_file is not None:
        url_file = settings.webhook_url_file
        if settings.format == "json":
            document: dict[str, Any] = {"report": folder.name, "link": settings.link, "figures": figures}
        else:
            document = {"text": message(figures, folder=folder.name, link=settings.link)}
        error = _tried(
            "webhook", lambda: webhook.post(url_file, document, timeout_s=settings.timeout_s), sleep=sleep
        )
        record("webhook", "failed" if error else "ok")
        if error:
            log.error(
                "report %s not pushed to the webhook after %d tries (the report is kept): %s",
                folder.name,
                TRIES,
                error,
                extra=logs.fields(target="webhook", report=folder.name),
            )
        else:
            log.info("report %s pushed to the webhook", folder.name, extra=logs.fields(target="webhook"))
    if settings.copy_to is not None:
        archive = settings.copy_to
        error = _tried(str(archive), lambda: _copy(folder, archive), sleep=sleep)
        record("copy", "failed" if error else "ok")
        if error:
            log.error(
                "report %s not copied to %s after %d tries (the report is kept): %s",
                folder.name,
                archive,
                TRIES,
                error,
                extra=logs.fields(target="copy", report=folder.name),
            )
        else:
            log.info("report %s copied to %s", folder.name, archive / folder.name)
