"""The demo's settings: read once from the environment, with the reason for each default."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

BACKENDS = ("prometheus", "victoriametrics")
"""What DEMO_BACKEND may name: the store the demo backfills, scrapes into and queries."""


class SettingsError(ValueError):
    """An environment variable the demo reads has a value it cannot use."""


@dataclass(frozen=True)
class DemoSettings:
    root: Path
    """Repository root: examples/, rules/ and .demo/ are found under it."""
    scenario: Path
    """Fleet scenario the exporters simulate and the history is backfilled from (DEMO_SCENARIO)."""
    days: float
    """Days of history to backfill (DEMO_DAYS, default 14: two weekly windows for the rightsizer)."""
    step: str
    """Backfill sample spacing (DEMO_STEP, default 120s: 14 days plus the recording rules stay
    within the 3-minute set-up on 2 busy cores; 60s doubles the backfill time)."""
    exit_when_done: bool
    """DEMO_EXIT=1: show everything once and exit instead of waiting for Ctrl-C (used by tests)."""
    services_only: bool
    """DEMO_SKIP_SECTIONS=1: start everything and print the URLs, without sections 1–3."""
    work: Path
    """Working files: history, logs, TLS pair, kubeconfig, plan and report (.demo/, gitignored)."""
    backend: str = "prometheus"
    """DEMO_BACKEND: ``prometheus`` (Prometheus scrapes and evaluates rules/) or ``victoriametrics``
    (single-node VictoriaMetrics; vmagent scrapes, vmalert evaluates rules/ and writes results back)."""
    rule_step_seconds: float = 300.0
    """Recording rules are backfilled every 5 minutes: the rightsizer's quantiles need no more, and
    it keeps the rules' share of the set-up under a minute."""
    max_history_age_hours: float = 6.0
    """Backfilled history older than this is rebuilt, so the last week is always covered."""

    @property
    def step_seconds(self) -> float:
        return float(self.step[:-1]) * (60.0 if self.step.endswith("m") else 1.0)

    @property
    def store_name(self) -> str:
        return "VictoriaMetrics" if self.backend == "victoriametrics" else "Prometheus"

    @property
    def history_dir(self) -> Path:
        return self.work / "history"

    @property
    def logs(self) -> Path:
        return self.work / "logs"


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    text = env.get(name, "")
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise SettingsError(f"{name}={text!r}: expected a number of days, e.g. {name}=1") from None
    if value <= 0 or value > 90:
        raise SettingsError(f"{name}={text!r}: must be more than 0 and at most 90")
    return value


def _repo_root() -> Path:
    """The checkout the demo runs from: the current directory when it holds the project, else the
    one this package was loaded from (an editable install), so `make demo` works from anywhere."""
    cwd = Path.cwd()
    if (cwd / "pyproject.toml").is_file() and (cwd / "rules").is_dir():
        return cwd
    return Path(__file__).resolve().parents[2]


def _flag(env: Mapping[str, str], name: str) -> bool:
    return env.get(name, "").lower() not in {"", "0", "false", "no"}


def from_env(env: Mapping[str, str] | None = None, *, root: Path | None = None) -> DemoSettings:
    env = os.environ if env is None else env
    base = (root or _repo_root()).resolve()
    scenario = Path(env.get("DEMO_SCENARIO", "examples/fleet-demo.yaml"))
    if not scenario.is_absolute():
        scenario = base / scenario
    step = env.get("DEMO_STEP", "120s")
    if not step[:-1].isdigit() or step[-1] not in "sm":
        raise SettingsError(f"DEMO_STEP={step!r}: expected seconds or minutes, e.g. 60s or 5m")
    work = Path(env.get("DEMO_DIR", str(base / ".demo")))
    backend = env.get("DEMO_BACKEND", "") or "prometheus"
    if backend not in BACKENDS:
        raise SettingsError(f"DEMO_BACKEND={backend[:40]!r}: expected one of {', '.join(BACKENDS)}")
    return DemoSettings(
        root=base,
        scenario=scenario,
        days=_float(env, "DEMO_DAYS", 14.0),
        step=step,
        exit_when_done=_flag(env, "DEMO_EXIT"),
        services_only=_flag(env, "DEMO_SKIP_SECTIONS"),
        work=work,
        backend=backend,
    )
