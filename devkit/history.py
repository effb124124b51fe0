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

import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import yaml

from devkit.prometheus import PrometheusError, PrometheusServer, ScrapeJob, require_binaries
from exporter.attribute.podresources.dra import Attribution
from exporter.expose import render
from exporter.expose.exposition import device_families
from gpupilot_common.timefmt import format_time
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


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def blocks(directory: Path) -> list[tuple[Path, dict[str, Any]]]:
    """The TSDB blocks directly under ``directory`` with their ``meta.json``."""
    found = []
    for meta in sorted(directory.glob("*/meta.json")):
        try:
            found.append((meta.parent, json.loads(meta.read_text())))
        except (OSError, ValueError):
            continue
    return found


def names_written(directory: Path, names: set[str]) -> set[str]:
    """Which of the metric ``names`` the blocks under ``directory`` hold samples of: a block with
    samples whose index lists the name in its symbol table (each symbol is stored as its uvarint
    length and its bytes, so a name is matched whole, never as part of a longer one)."""
    found: set[str] = set()
    for block, meta in blocks(directory):
        if not (meta.get("stats") or {}).get("numSamples"):
            continue
        index = (block / "index").read_bytes()
        found |= {n for n in names if _uvarint(len(n.encode())) + n.encode() in index}
    return found


def coverage(directory: Path) -> str:
    """``2026-11-17T00:00Z → 2026-12-01T00:00Z`` over the blocks under ``directory``, or ``no blocks``."""
    spans = [(m.get("minTime", 0) / 1000, m.get("maxTime", 0) / 1000) for _, m in blocks(directory)]
    if not spans:
        return "no blocks"
    return f"{format_time(min(a for a, _ in spans))} → {format_time(max(b for _, b in spans))}"


class RuleBackfillError(PrometheusError):
    """promtool wrote no samples for some recording rules; the message names them and why."""


PROMTOOL_BLOCK_SECONDS = 7200
"""promtool ``create-blocks-from rules`` evaluates the range one 2 h block at a time (its default
``--max-block-duration``, which :func:`backfill_rules` leaves alone), blocks aligned on even UTC hours."""


def promtool_rules_start(start: float, eval_interval: float) -> int:
    """The ``--start`` to give promtool for recording rules wanted from ``start``: ``start`` itself,
    or the next 2 h boundary when that is no more than one ``eval_interval`` away.

    In each block promtool evaluates from the rule group's first evaluation time at or after the
    block's start (the group's times are offset by a hash of its file path and name), and when that
    time falls after the block's end it stops for the *whole* range instead of going on to the next
    block: it exits 0 having queried nothing and written nothing (seen with promtool 2.42). That can
    happen only in the first block, when ``start`` lies less than one interval before its end: a
    demo run a few minutes after an even UTC hour. Starting at the boundary costs less than one
    interval of rule history."""
    first = int(start)
    boundary = -(-first // PROMTOOL_BLOCK_SECONDS) * PROMTOOL_BLOCK_SECONDS
    return boundary if 0 < boundary - first <= int(eval_interval) else first


def backfill_rules(
    data_dir: Path, rule_files: Sequence[Path], *, start: float, end: float, eval_interval: float
) -> list[Path]:
    """Backfill recording rules into ``data_dir``, pass by pass; returns the files done. Each pass
    must write samples for every rule of its file (promtool exits 0 having written nothing when the
    rules' inputs are missing over the range): otherwise :class:`RuleBackfillError` says which. A
    pass that fails keeps its working directory (promtool's output and the Prometheus log) and its
    error names it."""
    if int(eval_interval) >= PROMTOOL_BLOCK_SECONDS:
        raise PrometheusError(
            f"recording-rule backfill every {int(eval_interval)}s: promtool evaluates rules 2 h at a time "
            "and skips the rest of the range at a 2 h block with no evaluation in it; use an interval under 2 h"
        )
    _, tool = require_binaries()
    first = promtool_rules_start(start, eval_interval)
    done: list[Path] = []
    for path in recording_order(rule_files):
        work = Path(tempfile.mkdtemp(prefix=f"gpupilot-rules-{path.stem}-"))
        try:
            out = _rules_pass(tool, data_dir, path, work, start=first, end=end, eval_interval=eval_interval)
        except PrometheusError:
            raise  # its message points into ``work``, kept for the logs
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
        for block in out.iterdir():
            if block.is_dir():
                shutil.move(str(block), data_dir / block.name)
        shutil.rmtree(work, ignore_errors=True)
        done.append(path)
    return done


def _rules_pass(
    tool: str, data_dir: Path, path: Path, work: Path, *, start: int, end: float, eval_interval: float
) -> Path:
    """One promtool run over ``path`` against a Prometheus on ``data_dir``; the blocks it wrote."""
    names, _ = _records(path)
    out = work / "blocks"
    log = work / "promtool.log"
    with PrometheusServer(data_dir, log_file=work / "prometheus.log") as prom:
        cmd = [
            tool,
            "tsdb",
            "create-blocks-from",
            "rules",
            f"--start={start}",
            f"--end={int(end)}",
            f"--url={prom.url}",
            f"--output-dir={out}",
            f"--eval-interval={int(eval_interval)}s",
            str(path),
        ]
        began = time.monotonic()
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        took = time.monotonic() - began
    log.write_text(
        f"$ {' '.join(cmd)}\n# exit {res.returncode} after {took:.2f}s\n{res.stdout}{res.stderr}",
        errors="replace",
    )
    tail = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["no output"]
    if res.returncode != 0:
        raise PrometheusError(
            f"promtool create-blocks-from rules {path.name} failed: {tail[0]} (see {log} and {work / 'prometheus.log'})"
        )
    missing = names - (names_written(out, names) if out.is_dir() else set())
    if missing:
        raise RuleBackfillError(
            f"promtool create-blocks-from rules {path.name} wrote no samples for "
            f"{', '.join(sorted(missing))} over {format_time(start)} → {format_time(end)} in {took:.1f}s: their "
            f"inputs had no data there (the history covers {coverage(data_dir)}); promtool said: {tail[0]} "
            f"(see {log} and {work / 'prometheus.log'})"
        )
    out.mkdir(exist_ok=True)
    return out


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
        def body() -> str:
            now = self.clock()
            snap = backend.snapshot_at(now)
            allocations = backend.allocations(now)  # DRA claims and MIG reconfigurations follow time
            if isinstance(allocations, Attribution):
                allocations = allocations.resolve(snap).allocations
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
