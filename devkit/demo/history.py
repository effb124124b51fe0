"""Backfilled history for the demo's Prometheus, rebuilt only when it would no longer be right.

The history under ``.demo/history`` is reused when the scenario file's content, the number of
days and the step are those it was built from and it ended less than a few hours ago; otherwise
it is rebuilt with ``gpupilot-exporter backfill`` (the simulator's own command, which writes TSDB
blocks through ``promtool tsdb create-blocks-from openmetrics``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import BinaryIO

from devkit.demo.console import StepFailed
from devkit.demo.settings import DemoSettings

STAMP = "gpupilot-demo-history.json"


@dataclass(frozen=True)
class Stamp:
    scenario_sha256: str
    days: float
    step: str
    built_at: float


def wanted_stamp(settings: DemoSettings, *, now: float) -> Stamp:
    digest = hashlib.sha256(settings.scenario.read_bytes()).hexdigest()
    return Stamp(scenario_sha256=digest, days=settings.days, step=settings.step, built_at=now)


def reusable(settings: DemoSettings, wanted: Stamp) -> Stamp | None:
    path = settings.history_dir / STAMP
    try:
        old = Stamp(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None
    same = (old.scenario_sha256, old.days, old.step) == (wanted.scenario_sha256, wanted.days, wanted.step)
    fresh = wanted.built_at - old.built_at < settings.max_history_age_hours * 3600
    return old if same and fresh and (settings.history_dir / "data").is_dir() else None


def ensure_history(settings: DemoSettings, *, log: Path) -> tuple[Path, str]:
    """The TSDB directory to start Prometheus on, and a line saying where it came from."""
    now = time.time()
    wanted = wanted_stamp(settings, now=now)
    old = reusable(settings, wanted)
    data = settings.history_dir / "data"
    if old is not None:
        age = (now - old.built_at) / 60
        return (
            data,
            f"reused {old.days:g} days of history built {age:.0f} min ago (same scenario, days, step)",
        )
    if settings.history_dir.exists():
        shutil.rmtree(settings.history_dir)
    data.mkdir(parents=True)
    cmd = [
        sys.executable, "-m", "exporter", "backfill",
        "--scenario", str(settings.scenario),
        "--days", f"{settings.days:g}",
        "--step", settings.step,
        "--out", str(data),
    ]  # fmt: skip
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        assert proc.stderr is not None
        code = _relay_progress(proc, out)
    if code != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
        shutil.rmtree(settings.history_dir, ignore_errors=True)
        raise StepFailed(f"gpupilot-exporter backfill failed ({tail[0]}); see {log}")
    (settings.history_dir / STAMP).write_text(json.dumps(asdict(wanted)))
    return data, f"built {settings.days:g} days at a {settings.step} step in {time.time() - now:.0f}s"


def _relay_progress(proc: subprocess.Popen[bytes], out: BinaryIO, *, every: float = 10.0) -> int:
    """Copy the backfill's stderr to its log and show its progress line (``\\r``-updated).

    On a terminal the line is redrawn in place; otherwise one line is printed every ``every``
    seconds, so captured output stays short.
    """
    assert proc.stderr is not None
    tty = sys.stdout.isatty()
    last_print = 0.0
    pending = ""
    latest = ""
    while chunk := os.read(proc.stderr.fileno(), 4096):
        out.write(chunk)
        pending += chunk.decode(errors="replace")
        *done, pending = re.split(r"[\r\n]", pending)
        for piece in done:
            if piece.strip():
                latest = piece.strip()
        now = time.monotonic()
        if latest and tty:
            print(f"\r      │ {latest[:110]:<110}", end="", flush=True)
        elif latest and now - last_print >= every:
            print(f"      │ {latest[:110]}", flush=True)
            last_print = now
    code = proc.wait()
    final = (pending.strip() or latest)[:160]
    if tty:
        print(f"\r      │ {final:<110}", flush=True)
    elif final:
        print(f"      │ {final}", flush=True)
    return code
