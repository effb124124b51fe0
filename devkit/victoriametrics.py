"""Run a real VictoriaMetrics for tests, the demo and benchmarks: Debian's 1.79 or a built current one.

Which: ``$GPUPILOT_VICTORIAMETRICS`` (``1.79`` or ``debian``: Debian's ``victoria-metrics``
package on PATH, what ``make test`` runs; ``1.151`` or ``current``: the release ``devkit.gobuild``
builds from its Go module as the ``victoriametrics`` tool, with a progress line the first time, what
``make compat`` and ``make demo DEMO_BACKEND=victoriametrics`` run). Each binary below is found
through :func:`require_binary`.

:class:`VictoriaMetricsServer` starts the single-node server on a free loopback port (optionally
scraping targets with its built-in ``-promscrape.config``) and waits for ``/health``;
:class:`VMAgent` scrapes targets and remote-writes to it instead.
:class:`VMAlert` runs ``vmalert`` over rule files against it: recording rules are written back through
remote write; alert state is read from vmalert's API and the ALERTS series it writes back.

History goes in two ways, measured on the same history (``python -m devkit.victoriametrics``):
:func:`import_history` streams the simulator's windows as Prometheus text (millisecond timestamps) to
``/api/v1/import/prometheus``; :func:`vmctl_import` reads TSDB blocks written by promtool with
``vmctl prometheus``. Both end with ``/internal/force_flush`` so the samples are searchable at once.

VictoriaMetrics hides the last ``-search.latencyOffset`` (30 s by default) from instant queries at
"now"; the server here runs with ``latency_offset="1s"`` unless told otherwise so that a fresh setup
does not look empty for half a minute.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import pty
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import yaml

from devkit import gobuild
from devkit.process import LoopbackServer
from devkit.prometheus import ScrapeJob, free_port, scrape_configs
from gpupilot_common.timefmt import format_time
from simulator import backfill
from simulator.model import Scenario


class VictoriaMetricsError(RuntimeError):
    pass


BINARIES = ("victoria-metrics", "vmagent", "vmalert", "vmctl")

ENGINE_ENV = "GPUPILOT_VICTORIAMETRICS"
DEBIAN = "1.79"
CURRENT = gobuild.VICTORIAMETRICS_RELEASE.lstrip("v").rsplit(".", 1)[0]
"""The built release's major.minor (``1.151``)."""
ALIASES = {"debian": DEBIAN, "current": CURRENT}
DEMO_DEFAULT = CURRENT
"""What ``make demo DEMO_BACKEND=victoriametrics`` starts unless told otherwise."""


def engine(name: str | None = None) -> str:
    """``1.79`` (Debian's) or the built release's ``major.minor``: ``name``, else
    ``$GPUPILOT_VICTORIAMETRICS``, else Debian's."""
    raw = (name if name is not None else os.environ.get(ENGINE_ENV, "")).strip() or DEBIAN
    key = ALIASES.get(raw.lower(), raw)
    if key not in (DEBIAN, CURRENT):
        known = ", ".join([DEBIAN, CURRENT, *ALIASES])
        raise VictoriaMetricsError(f"{ENGINE_ENV}={raw}: no such VictoriaMetrics (known: {known})")
    return key


def select_default(default: str = DEMO_DEFAULT) -> str:
    """For an entry point (the demo): ``$GPUPILOT_VICTORIAMETRICS``, else ``default``, set in the
    environment so that every process started from here runs the same one."""
    chosen = engine(os.environ.get(ENGINE_ENV, "") or default)
    os.environ[ENGINE_ENV] = chosen
    return chosen


def require_binary(name: str, selected: str | None = None) -> str:
    """The path of ``name`` (one of :data:`BINARIES`) in the selected VictoriaMetrics."""
    if engine(selected) == CURRENT:
        try:
            return str(gobuild.binary("victoriametrics", name))
        except gobuild.GoToolError as exc:
            raise VictoriaMetricsError(f"VictoriaMetrics {CURRENT}: {exc}") from None
    path = shutil.which(name)
    if not path:
        raise VictoriaMetricsError(
            f"{name} not found: run 'make victoriametrics' as root or 'sudo apt-get install victoria-metrics'"
        )
    return path


def scrape_config(scrape_jobs: Sequence[ScrapeJob]) -> dict[str, object]:
    """A ``-promscrape.config`` document (Prometheus' ``scrape_configs``) for ``scrape_jobs``."""
    return {"scrape_configs": scrape_configs(scrape_jobs)}


class VictoriaMetricsServer(LoopbackServer):
    """A real single-node VictoriaMetrics on 127.0.0.1:<free port>. Use as a context manager."""

    error = VictoriaMetricsError

    def __init__(
        self,
        data_dir: Path,
        *,
        scrape_jobs: Sequence[ScrapeJob] = (),
        port: int | None = None,
        latency_offset: str = "1s",
        extra_args: Sequence[str] = (),
        log_file: Path | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.port = port or free_port()
        self.scrape_jobs = list(scrape_jobs)
        self.latency_offset = latency_offset
        self.extra_args = list(extra_args)
        self.log_file = log_file or data_dir.parent / f"victoria-metrics-{self.port}.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def scrape_config(self) -> dict[str, object]:
        return scrape_config(self.scrape_jobs)

    def start(self, *, timeout: float = 60.0) -> VictoriaMetricsServer:
        binary = require_binary("victoria-metrics")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            binary,
            f"-storageDataPath={self.data_dir}",
            f"-httpListenAddr=127.0.0.1:{self.port}",
            "-retentionPeriod=100y",
            f"-search.latencyOffset={self.latency_offset}",
            "-loggerLevel=WARN",
            *self.extra_args,
        ]
        if self.scrape_jobs:
            cfg = self.data_dir.parent / f"victoria-metrics-{self.port}-scrape.yml"
            cfg.write_text(yaml.safe_dump(self.scrape_config(), sort_keys=False))
            cmd.append(f"-promscrape.config={cfg}")
        self._launch(cmd, name="victoria-metrics", health_path="/health", timeout=timeout)
        return self

    def force_flush(self) -> None:
        """Make every sample received so far searchable (``/internal/force_flush``)."""
        with urllib.request.urlopen(f"{self.url}/internal/force_flush", timeout=60):
            pass

    def import_prometheus(self, body: bytes) -> None:
        """POST Prometheus text exposition (millisecond timestamps) to ``/api/v1/import/prometheus``."""
        req = urllib.request.Request(
            f"{self.url}/api/v1/import/prometheus",
            data=body,
            method="POST",
            headers={"Content-Type": "text/plain"},
        )
        try:
            with urllib.request.urlopen(req, timeout=300) as r:
                r.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace").strip().splitlines()[:1] or [str(exc.code)]
            raise VictoriaMetricsError(f"victoria-metrics refused an import: {detail[0]}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise VictoriaMetricsError(
                f"victoria-metrics refused an import of {len(body):,} bytes: {reason}"
            ) from None


@dataclass(frozen=True)
class ImportStats:
    samples: int
    seconds: float


def import_history(
    server: VictoriaMetricsServer,
    scenario: Scenario,
    *,
    start: float,
    end: float,
    step: float,
    progress: TextIO | None = None,
) -> ImportStats:
    """Stream a scenario's history over ``[start, end]`` into ``server`` through its import API."""
    started = time.monotonic()
    filler = backfill.Backfiller(scenario)
    first = math.ceil(start / step) * step
    if first > end:
        raise VictoriaMetricsError("import_history: no sample between start and end")
    windows = list(range(int(first // backfill.BLOCK_S * backfill.BLOCK_S), int(end) + 1, backfill.BLOCK_S))
    total = 0
    for n, w in enumerate(windows):
        ts = backfill.timestamps(max(float(w), start), min(float(w + backfill.BLOCK_S) - 1e-3, end), step)
        if not len(ts):
            continue
        buf = io.StringIO()
        # Same writer as the promtool path; VictoriaMetrics wants millisecond timestamps.
        total += backfill.write_window(buf, filler.window(ts), (ts * 1000.0).round())
        server.import_prometheus(buf.getvalue().encode())
        if progress is not None:
            progress.write(f"\rimport: window {n + 1}/{len(windows)}, {total:,} samples")
            progress.flush()
    server.force_flush()
    if progress is not None:
        progress.write("\n")
    return ImportStats(total, time.monotonic() - started)


def vmctl_import(server: VictoriaMetricsServer, blocks_dir: Path) -> float:
    """Import TSDB blocks (a Prometheus data directory or snapshot) with ``vmctl prometheus``; seconds."""
    binary = require_binary("vmctl")
    started = time.monotonic()
    cmd = [
        binary,
        "prometheus",
        "-s",
        # renamed after 1.79
        "--disable-progress-bar" if engine() == CURRENT else "--vm-disable-progress-bar",
        f"--prom-snapshot={blocks_dir}",
        f"--vm-addr={server.url}",
        "--vm-concurrency=2",
    ]
    # vmctl 1.79 exits ("inappropriate ioctl for device") unless its output is a terminal: give it a pty.
    primary, secondary = pty.openpty()
    chunks: list[bytes] = []

    def drain() -> None:
        with contextlib.suppress(OSError):
            while data := os.read(primary, 65536):
                chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        proc = subprocess.run(cmd, stdin=secondary, stdout=secondary, stderr=secondary, check=False)
    finally:
        os.close(secondary)
        reader.join(timeout=5)
        os.close(primary)
    if proc.returncode != 0:
        lines = b"".join(chunks).decode(errors="replace").strip().splitlines()
        tail = [ln for ln in lines if ln.strip()][-1:] or ["no output"]
        raise VictoriaMetricsError(f"vmctl prometheus {blocks_dir} failed: {tail[0].strip()}")
    server.force_flush()
    return time.monotonic() - started


class VMAgent(LoopbackServer):
    """``vmagent`` scraping ``scrape_jobs`` and remote-writing to a VictoriaMetrics (as a fleet runs
    it: vmagent per cluster, the store elsewhere)."""

    error = VictoriaMetricsError

    def __init__(
        self, server: VictoriaMetricsServer, scrape_jobs: Sequence[ScrapeJob], *, log_file: Path | None = None
    ) -> None:
        self.server = server
        self.scrape_jobs = list(scrape_jobs)
        self.port = free_port()
        self.work_dir = server.data_dir.parent / f"vmagent-{self.port}"
        self.log_file = log_file or server.data_dir.parent / f"vmagent-{self.port}.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, *, timeout: float = 60.0) -> VMAgent:
        binary = require_binary("vmagent")
        self.work_dir.mkdir(parents=True, exist_ok=True)
        cfg = self.work_dir / "scrape.yml"
        cfg.write_text(yaml.safe_dump(scrape_config(self.scrape_jobs), sort_keys=False))
        cmd = [
            binary,
            f"-promscrape.config={cfg}",
            f"-remoteWrite.url={self.server.url}/api/v1/write",
            f"-remoteWrite.tmpDataPath={self.work_dir / 'queue'}",
            "-remoteWrite.flushInterval=1s",
            f"-httpListenAddr=127.0.0.1:{self.port}",
            "-loggerLevel=WARN",
        ]
        self._launch(cmd, name="vmagent", health_path="/health", timeout=timeout)
        return self


class VMAlert(LoopbackServer):
    """``vmalert`` evaluating ``rule_files`` against a VictoriaMetrics, writing recording rules back."""

    error = VictoriaMetricsError

    def __init__(
        self,
        server: VictoriaMetricsServer,
        rule_files: Sequence[Path],
        *,
        evaluation_interval: str = "10s",
        log_file: Path | None = None,
    ) -> None:
        self.server = server
        self.rule_files = [Path(p).resolve() for p in rule_files]
        self.evaluation_interval = evaluation_interval
        self.port = free_port()
        self.log_file = log_file or server.data_dir.parent / f"vmalert-{self.port}.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, *, timeout: float = 60.0) -> VMAlert:
        binary = require_binary("vmalert")
        cmd = [
            binary,
            *[f"-rule={p}" for p in self.rule_files],
            f"-datasource.url={self.server.url}",
            f"-remoteWrite.url={self.server.url}",
            f"-remoteRead.url={self.server.url}",
            # vmalert 1.79 requires a notifier for alerting rules; nothing listens there (it logs the
            # failed sends): alert state is read from its /api/v1/rules and the ALERTS series.
            f"-notifier.url=http://127.0.0.1:{free_port()}",
            f"-evaluationInterval={self.evaluation_interval}",
            "-remoteWrite.flushInterval=1s",
            f"-httpListenAddr=127.0.0.1:{self.port}",
            "-loggerLevel=WARN",
        ]
        self._launch(cmd, name="vmalert", health_path="/health", timeout=timeout)
        return self

    def rules(self) -> list[dict[str, object]]:
        """Every rule vmalert holds, from its ``/api/v1/rules``."""
        with urllib.request.urlopen(f"{self.url}/api/v1/rules", timeout=30) as r:
            body = json.load(r)
        return [rule for g in body["data"]["groups"] for rule in g.get("rules", [])]


def replay_rules(
    server: VictoriaMetricsServer,
    rule_file: Path,
    *,
    start: float,
    end: float,
    eval_interval: float,
    log_file: Path,
    timeout: float = 900.0,
) -> None:
    """Evaluate ``rule_file``'s recording rules over ``[start, end]`` every ``eval_interval`` seconds
    and write the results into ``server``: ``vmalert``'s replay mode (``-replay.timeFrom``/``timeTo``;
    VictoriaMetrics' counterpart of ``promtool tsdb create-blocks-from rules``), which asks range
    queries and remote-writes what they return, then exits. A rule reading another rule's results
    needs the first one's file replayed (and flushed) before it; samples are searchable on return."""
    cmd = [
        require_binary("vmalert"),
        f"-rule={Path(rule_file).resolve()}",
        f"-datasource.url={server.url}",
        f"-remoteWrite.url={server.url}",
        f"-replay.timeFrom={format_time(start)}",
        f"-replay.timeTo={format_time(end)}",
        f"-evaluationInterval={max(1, round(eval_interval))}s",
        "-replay.disableProgressBar",
        f"-httpListenAddr=127.0.0.1:{free_port()}",
        "-loggerLevel=WARN",
    ]
    with log_file.open("ab") as out:
        try:
            res = subprocess.run(cmd, stdout=out, stderr=out, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            raise VictoriaMetricsError(
                f"vmalert replay of {rule_file.name} took over {timeout:.0f}s"
            ) from None
    if res.returncode != 0:
        tail = log_file.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise VictoriaMetricsError(f"vmalert replay of {rule_file.name} failed: {tail[0]}; see {log_file}")
    server.force_flush()


def compare_imports(scenario_path: Path, *, days: float, step: float, work: Path, out: TextIO) -> None:
    """Import the same history both ways into fresh servers and print the time of each."""
    from devkit.history import build_history  # noqa: PLC0415
    from simulator import scenario as scenario_mod  # noqa: PLC0415

    scen = scenario_mod.load(scenario_path)
    now = time.time()
    end = now - now % step
    start = end - days * 86400.0
    with VictoriaMetricsServer(work / "vm-import" / "data") as vm:
        stats = import_history(vm, scen, start=start, end=end, step=step)
    t0 = time.monotonic()
    history = build_history(
        scenario_path, start=start, end=end, step=step, out_dir=work / "blocks", progress=None
    )
    promtool_s = time.monotonic() - t0
    with VictoriaMetricsServer(work / "vm-vmctl" / "data") as vm:
        vmctl_s = vmctl_import(vm, work / "blocks")
    out.write(
        f"{history.samples:,} samples over {days:g} days of {scenario_path.name}, one every {step:g}s\n"
        f"  import API (/api/v1/import/prometheus): {stats.seconds:6.1f} s\n"
        f"  promtool blocks + vmctl prometheus:     {promtool_s + vmctl_s:6.1f} s "
        f"({promtool_s:.1f} s blocks, {vmctl_s:.1f} s vmctl)\n"
    )


def main(argv: Sequence[str] | None = None) -> int:
    import argparse  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    parser = argparse.ArgumentParser(
        prog="python -m devkit.victoriametrics",
        description="Time the two ways of putting simulated history into VictoriaMetrics.",
    )
    parser.add_argument(
        "--scenario", type=Path, default=Path("tests/data/fleet-small.yaml"), help="fleet scenario"
    )
    parser.add_argument("--days", type=float, default=7.0, help="days of history (default 7)")
    parser.add_argument("--step", type=float, default=60.0, help="seconds between samples (default 60)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gpupilot-vm-") as tmp:
        compare_imports(args.scenario, days=args.days, step=args.step, work=Path(tmp), out=sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
