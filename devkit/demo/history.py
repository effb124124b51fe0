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

import yaml

from devkit import history as sim_history
from devkit.demo import procs, rulesubset
from devkit.demo.console import StepFailed
from devkit.demo.settings import DemoSettings
from devkit.prometheus import PrometheusError

STAMP = "gpupilot-demo-history.json"
RULE_DAYS = 7.0
LIVE_GAP_SECONDS = 360
"""The rightsizer's default window: recording rules are backfilled over this much, not all days."""


@dataclass(frozen=True)
class Stamp:
    scenario_sha256: str
    rules_sha256: str
    days: float
    step: str
    built_at: float


def rule_files(settings: DemoSettings) -> list[Path]:
    return sorted((settings.root / "rules").glob("*.rules.yaml"))


def wanted_stamp(settings: DemoSettings, *, now: float) -> Stamp:
    digest = hashlib.sha256(settings.scenario.read_bytes()).hexdigest()
    rules = hashlib.sha256(b"".join(p.read_bytes() for p in rule_files(settings))).hexdigest()
    return Stamp(
        scenario_sha256=digest, rules_sha256=rules, days=settings.days, step=settings.step, built_at=now
    )


def reusable(settings: DemoSettings, wanted: Stamp) -> Stamp | None:
    path = settings.history_dir / STAMP
    try:
        old = Stamp(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None
    same = (old.scenario_sha256, old.rules_sha256, old.days, old.step) == (
        wanted.scenario_sha256,
        wanted.rules_sha256,
        wanted.days,
        wanted.step,
    )
    fresh = wanted.built_at - old.built_at < settings.max_history_age_hours * 3600
    return old if same and fresh and (settings.history_dir / "data").is_dir() else None


def history_end(settings: DemoSettings) -> float:
    """The last backfilled sample of the history in ``settings.history_dir`` (0 when none is stamped)."""
    try:
        built = float(json.loads((settings.history_dir / STAMP).read_text())["built_at"])
    except (OSError, ValueError, TypeError, KeyError):
        return 0.0
    return float(int(built) - LIVE_GAP_SECONDS)


def ensure_history(settings: DemoSettings, *, log: Path) -> tuple[Path, str]:
    """The TSDB directory to start Prometheus on, and a line saying where it came from."""
    now = time.time()
    # Stop short of now by more than Prometheus' 5-minute lookback, so instant queries never see a
    # backfilled sample and a live one for the same series at once (different job/instance).
    end = float(int(now) - LIVE_GAP_SECONDS)
    start = end - settings.days * 86400
    wanted = wanted_stamp(settings, now=now)
    old = reusable(settings, wanted)
    data = settings.history_dir / "data"
    if old is not None:
        age = (now - old.built_at) / 60
        return (
            data,
            f"reused {old.days:g} days of history built {age:.0f} min ago (same scenario, rules, days and step)",
        )
    if settings.history_dir.exists():
        shutil.rmtree(settings.history_dir)
    data.mkdir(parents=True)
    cmd = [
        sys.executable, "-m", "exporter", "backfill",
        "--scenario", str(settings.scenario),
        "--start", f"{start:.0f}",
        "--end", f"{end:.0f}",
        "--step", settings.step,
        "--out", str(data),
    ]  # fmt: skip
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        proc = procs.popen_in_own_group(cmd, stdout=out, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        try:
            code = _relay_progress(proc, out)
        finally:
            # Interrupted (Ctrl-C, SIGTERM) or failed: the backfill and its promtool children go too.
            procs.stop_group(proc)
    if code != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
        shutil.rmtree(settings.history_dir, ignore_errors=True)
        raise StepFailed(f"gpupilot-exporter backfill failed ({tail[0]}); see {log}")
    raw_seconds = time.time() - now
    rules_seconds = _backfill_rules(settings, data, start=start, end=end)
    (settings.history_dir / STAMP).write_text(json.dumps(asdict(wanted)))
    return data, (
        f"built {settings.days:g} days at a {settings.step} step in {raw_seconds:.0f}s, "
        f"recording rules for plan/report every {settings.rule_step_seconds:.0f}s in {rules_seconds:.0f}s"
    )


def rule_levels(
    settings: DemoSettings, directory: Path, *, start: float, end: float
) -> tuple[float, list[Path]]:
    """Where the rules' history starts (the rightsizer's default window, within the history) and the
    recording rules plan and report read, one file per level (a rule after those it reads)."""
    return max(start, end - RULE_DAYS * 86400), rulesubset.write_levels(rule_files(settings), directory)


def _backfill_rules(settings: DemoSettings, data: Path, *, start: float, end: float) -> float:
    """The recording rules plan and report read, over the window they read, so they see history."""
    begun = time.time()
    rule_start, levels = rule_levels(settings, settings.history_dir / "rules-backfill", start=start, end=end)
    for path in levels:
        t0 = time.time()
        names = [r["record"] for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"]]
        try:
            sim_history.backfill_rules(
                data, [path], start=rule_start, end=end, eval_interval=settings.rule_step_seconds
            )
        except PrometheusError as err:
            shutil.rmtree(settings.history_dir, ignore_errors=True)
            raise StepFailed(f"recording-rule backfill ({', '.join(names)}) failed: {err}") from err
        print(
            f"      │ {len(names)} recording rules over the last {(end - rule_start) / 86400:g} days: {time.time() - t0:.0f}s",
            flush=True,
        )
    return time.time() - begun


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
