"""Simulated Prometheus history, shared by the ``prometheus_history`` test fixture and the demo.

:func:`build_history` backfills a scenario's device and cluster series over ``[start, end]`` into a
Prometheus data directory (``gpupilot-exporter backfill``'s engine), then, when asked, backfills
the *recording rules* over the same range with ``promtool tsdb create-blocks-from rules`` so that
``gpupilot:*`` series have history too. promtool cannot evaluate a rule over another rule that is
being backfilled in the same run, so rule files go in dependency order, one pass each: a temporary
Prometheus serves the data written so far, promtool evaluates one file against it, and the blocks it
writes join the data directory before the next file (minutes for a week: the fixture skips it).

:class:`LiveFleet` serves the same scenario live (every node's device series and the cluster series)
so that a Prometheus over a history ending now keeps receiving the same series.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import yaml

from devkit.prometheus import PrometheusError, PrometheusServer, ScrapeJob, require_binaries
from exporter import render
from exporter.exposition import device_families
from simulator import backfill
from simulator import scenario as scenario_mod
from simulator.backend import SimBackend
from simulator.cluster_server import ClusterServer, SeriesServer
from simulator.model import Scenario

DROP_TARGET_LABELS: tuple[dict[str, object], ...] = ({"action": "labeldrop", "regex": "job|instance"},)
"""Backfilled series carry no ``job``/``instance``; live samples drop them to continue those series."""


@dataclass(frozen=True)
class History:
    data_dir: Path
    scenario_path: Path
    start: float
    end: float
    step: float
    samples: int
    seconds: float
    scenario: Scenario
    rule_files: tuple[Path, ...] = ()
    """Recording-rule files whose results were backfilled too."""


def _records(path: Path) -> tuple[set[str], str]:
    doc = yaml.safe_load(path.read_text()) or {}
    names: set[str] = set()
    exprs: list[str] = []
    for group in doc.get("groups", []) or []:
        for rule in group.get("rules", []) or []:
            if "record" in rule:
                names.add(str(rule["record"]))
                exprs.append(str(rule.get("expr", "")))
    return names, "\n".join(exprs)


def recording_order(rule_files: Sequence[Path]) -> list[Path]:
    """Files with recording rules, each after the files whose records its expressions use."""
    info = {p: _records(p) for p in rule_files}
    info = {p: v for p, v in info.items() if v[0]}
    deps = {
        p: {
            q
            for q, (names, _) in info.items()
            if q != p and any(re.search(rf"\b{re.escape(n)}\b", expr) for n in names)
        }
        for p, (_, expr) in info.items()
    }
    ordered: list[Path] = []
    while deps:
        ready = sorted(p for p, d in deps.items() if not d - set(ordered))
        if not ready:  # a cycle: keep the rest in name order, promtool will leave those gaps
            ready = sorted(deps)
        for p in ready:
            ordered.append(p)
            del deps[p]
    return ordered


def backfill_rules(
    data_dir: Path, rule_files: Sequence[Path], *, start: float, end: float, eval_interval: float
) -> list[Path]:
    """Backfill recording rules into ``data_dir``, pass by pass; returns the files done."""
    _, tool = require_binaries()
    done: list[Path] = []
    for path in recording_order(rule_files):
        with tempfile.TemporaryDirectory(prefix="gpupilot-rules-") as tmp:
            out = Path(tmp) / "blocks"
            with PrometheusServer(data_dir, log_file=Path(tmp) / "prometheus.log") as prom:
                cmd = [
                    tool,
                    "tsdb",
                    "create-blocks-from",
                    "rules",
                    f"--start={int(start)}",
                    f"--end={int(end)}",
                    f"--url={prom.url}",
                    f"--output-dir={out}",
                    f"--eval-interval={int(eval_interval)}s",
                    str(path),
                ]
                res = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if res.returncode != 0:
                tail = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["no output"]
                raise PrometheusError(f"promtool create-blocks-from rules {path.name} failed: {tail[0]}")
            if out.is_dir():
                for block in out.iterdir():
                    if block.is_dir():
                        shutil.move(str(block), data_dir / block.name)
        done.append(path)
    return done


def build_history(
    scenario: str | Path,
    *,
    start: float,
    end: float,
    step: float,
    out_dir: Path,
    rule_files: Sequence[Path] = (),
    rule_eval_interval: float | None = None,
    progress: TextIO | None = sys.stderr,
    jobs: int = 2,
) -> History:
    """Backfill ``scenario`` into ``out_dir`` (a Prometheus data dir), then its recording rules."""
    path = Path(scenario)
    scen = scenario_mod.load(path)
    settings = backfill.BackfillSettings(start=start, end=end, step=step, out_dir=out_dir, jobs=jobs)
    stats = backfill.run(scen, settings, progress=progress)
    done: list[Path] = []
    if rule_files:
        done = backfill_rules(
            out_dir, rule_files, start=start, end=end, eval_interval=rule_eval_interval or max(step, 60.0)
        )
    return History(out_dir, path, start, end, step, stats.samples, stats.seconds, scen, tuple(done))


class LiveFleet:
    """Every node of a scenario as a live ``/metrics`` target (device series, as the sim exporter
    publishes them), plus the cluster series, on free loopback ports; values follow ``clock``.

    Used after a backfill that ends now, so that a Prometheus scraping these keeps the history going
    (same series: :data:`DROP_TARGET_LABELS` removes ``job``/``instance``) and its rules evaluate live.
    """

    def __init__(self, scenario: Scenario, *, clock: Callable[[], float] = time.time) -> None:
        self.scenario = scenario
        self.clock = clock
        self.servers: list[SeriesServer] = []

    def _node_body(self, backend: SimBackend) -> Callable[[], str]:
        allocations = backend.allocations()

        def body() -> str:
            snap = backend.snapshot_at(self.clock())
            return render.render_text(
                device_families(snap, hostname=backend.hostname, allocations=allocations)
            )

        return body

    def start(self) -> LiveFleet:
        for node in self.scenario.nodes:
            backend = SimBackend(self.scenario, node=node.name)
            self.servers.append(SeriesServer(self._node_body(backend)).start())
        self.servers.append(ClusterServer(self.scenario, clock=self.clock).start())
        return self

    def scrape_jobs(self, *, interval: str = "15s") -> list[ScrapeJob]:
        nodes = [f"127.0.0.1:{s.port}" for s in self.servers[:-1]]
        cluster = [f"127.0.0.1:{self.servers[-1].port}"]
        return [
            ScrapeJob(
                "gpupilot-sim-nodes", nodes, interval=interval, metric_relabel_configs=DROP_TARGET_LABELS
            ),
            ScrapeJob(
                "gpupilot-sim-cluster", cluster, interval=interval, metric_relabel_configs=DROP_TARGET_LABELS
            ),
        ]

    def stop(self) -> None:
        for server in self.servers:
            server.close()
        self.servers = []

    def __enter__(self) -> LiveFleet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
