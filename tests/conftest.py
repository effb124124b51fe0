"""Shared fixtures. ``prometheus_history``: a real Prometheus over a week of simulated fleet history.

Kept import-cheap: the simulator and devkit are imported inside the fixture, only when a test asks.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
HISTORY_SCENARIO = REPO / "tests" / "data" / "fleet-small.yaml"
HISTORY_DAYS = 7
HISTORY_STEP_S = 60.0
"""One sample a minute: [1m]+ rates and 5-minute windows work; a week of 4 nodes backfills in ~20 s."""
HISTORY_AHEAD_S = 3600.0
"""History runs this far past the fixture's start so that queries at 'now' find data all session."""


@dataclass(frozen=True)
class PrometheusHistory:
    url: str
    start: float
    """First sample (Unix seconds)."""
    end: float
    """Last sample (Unix seconds); ``now + 1 h`` so instant queries at the current time keep working."""
    now: float
    """When the fixture was built; the rules' own history (``gpupilot:*``) was backfilled up to ``end``."""
    scenario_path: Path
    step: float
    data_dir: Path
    rule_files: tuple[Path, ...]


@pytest.fixture(scope="session")
def prometheus_history(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusHistory]:
    from devkit.history import build_history  # noqa: PLC0415
    from devkit.prometheus import PrometheusServer  # noqa: PLC0415

    base = tmp_path_factory.mktemp("prometheus-history")
    data = base / "data"
    now = time.time()
    end = (now - now % HISTORY_STEP_S) + HISTORY_AHEAD_S
    start = end - HISTORY_DAYS * 86400.0 - HISTORY_AHEAD_S
    rules = tuple(sorted((REPO / "rules").glob("*.rules.yaml")))
    history = build_history(
        HISTORY_SCENARIO,
        start=start,
        end=end,
        step=HISTORY_STEP_S,
        out_dir=data,
        rule_files=rules,
        rule_eval_interval=HISTORY_STEP_S,
        progress=None,
    )
    server = PrometheusServer(data, rule_files=rules, log_file=base / "prometheus.log")
    server.start()
    try:
        yield PrometheusHistory(
            url=server.url,
            start=history.start,
            end=history.end,
            now=now,
            scenario_path=HISTORY_SCENARIO,
            step=HISTORY_STEP_S,
            data_dir=data,
            rule_files=rules,
        )
    finally:
        server.stop()
