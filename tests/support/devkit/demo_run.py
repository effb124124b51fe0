"""Running ``python -m devkit.demo`` from a test: its environment (a work folder of its own, one day
of history unless a test asks more) and the processes it leaves behind."""

from __future__ import annotations

import os
from pathlib import Path

import psutil

from devkit import prometheus, victoriametrics
from devkit.demo.main import MARKER


def demo_env(work: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEMO_")}
    env.update({"DEMO_DIR": str(work), "DEMO_DAYS": "1"})
    # the releases this test run is on (make test: Debian's), not the demo's own default (the newest)
    env.update(
        {
            prometheus.ENGINE_ENV: prometheus.engine().name,
            victoriametrics.ENGINE_ENV: victoriametrics.engine(),
        }
    )
    env.update(extra)
    return env


def leftovers(work: Path) -> list[str]:
    """Processes carrying the demo's marker (it sets it for everything it starts) for this run."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            marked = proc.environ().get(MARKER) == str(work)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if marked and proc.info["pid"] != os.getpid():
            found.append(f"{proc.info['pid']}: {' '.join(proc.info['cmdline'] or [])[:160]}")
    return found
