"""Run a real Prometheus for tests, the demo and the benchmarks: Debian's 2.42 or a built 3.x.

``PrometheusServer`` starts ``prometheus`` on a free loopback port over a data directory (which may
hold blocks backfilled with ``promtool tsdb create-blocks-from openmetrics``), with optional scrape
targets and rule files, waits until ``/-/ready`` answers, and stops it cleanly.

Which Prometheus: one :class:`Engine` of :data:`ENGINES`, chosen by ``$GPUPILOT_PROMETHEUS``
(``2.42``: Debian's ``prometheus``/``promtool`` on PATH; ``3.13``: the current long-term-support
release; ``3.16``: the newest; ``debian``, ``lts`` and ``latest`` say the same). The 3.x engines are
built from their Go modules by ``devkit.gobuild`` (``prometheus-lts``, ``prometheus-latest``) the
first time they are asked for, with a progress line. Tests default to 2.42; ``make demo`` and
``make e2e`` to 3.13 (:func:`select_default`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from devkit import gobuild, process
from devkit.process import LoopbackServer

free_port = process.free_port  # where the tests, the demo and the benchmarks take it from

ENGINE_ENV = "GPUPILOT_PROMETHEUS"
"""The environment variable naming the Prometheus the tests, the demo and the e2e start."""


class PrometheusError(RuntimeError):
    pass


@dataclass(frozen=True)
class Engine:
    """One Prometheus release the project runs on."""

    name: str
    """What ``$GPUPILOT_PROMETHEUS`` says: ``2.42``, ``3.13``, ``3.16``."""
    tool: str = ""
    """The ``devkit.gobuild`` tool that builds it; empty for Debian's package on PATH."""

    @property
    def major(self) -> int:
        return int(self.name.split(".")[0])

    @property
    def release(self) -> str:
        """The full release (``3.13.5``), or ``Debian's 2.42`` for the system's package."""
        return gobuild.TOOLS[self.tool].release if self.tool else f"Debian's {self.name}"

    @property
    def has_web_ui(self) -> bool:
        """Debian's package serves the web UI; the built ones serve the API only (the UI's assets are
        built with npm upstream and are not in the Go module)."""
        return not self.tool

    def binaries(self, *, build_missing: bool = True) -> tuple[str, str]:
        """``prometheus`` and ``promtool`` of this engine (built first when missing and allowed)."""
        if not self.tool:
            prom, tool = shutil.which("prometheus"), shutil.which("promtool")
            if not prom or not tool:
                raise PrometheusError(
                    "prometheus/promtool not found: run 'make test' as root or 'sudo apt-get install prometheus'"
                )
            return prom, tool
        try:
            prom_path = gobuild.binary(self.tool, "prometheus", build_missing=build_missing)
        except gobuild.GoToolError as exc:
            raise PrometheusError(
                f"Prometheus {self.name}: {exc} (or {ENGINE_ENV}=2.42 for Debian's package)"
            ) from None
        return str(prom_path), str(prom_path.parent / "promtool")

    def available(self) -> bool:
        """Whether its binaries are there now (nothing is built)."""
        try:
            self.binaries(build_missing=False)
        except PrometheusError:
            return False
        return True


ENGINES: dict[str, Engine] = {
    e.name: e for e in (Engine("2.42"), Engine("3.13", "prometheus-lts"), Engine("3.16", "prometheus-latest"))
}
ALIASES = {"debian": "2.42", "lts": "3.13", "latest": "3.16"}
TEST_DEFAULT = "2.42"
"""What the tests start unless told otherwise (``make test``; ``make compat`` runs the 3.x lines)."""
LTS = "3.13"
"""What ``make demo`` and ``make e2e`` start unless told otherwise."""


def engine(name: str | None = None) -> Engine:
    """The engine called ``name``, else the one ``$GPUPILOT_PROMETHEUS`` names, else 2.42."""
    raw = (name if name is not None else os.environ.get(ENGINE_ENV, "")).strip() or TEST_DEFAULT
    key = ALIASES.get(raw.lower(), raw)
    if key not in ENGINES:
        known = ", ".join([*ENGINES, *ALIASES])
        raise PrometheusError(f"{ENGINE_ENV}={raw}: no such Prometheus (known: {known})")
    return ENGINES[key]


def select_default(default: str = LTS) -> Engine:
    """For an entry point (the demo, the e2e): the engine ``$GPUPILOT_PROMETHEUS`` names, else
    ``default``; set in the environment so every process started from here runs the same one, and
    its folder put first on PATH so a ``promtool`` found there (the simulator's backfill) is its own."""
    chosen = engine(os.environ.get(ENGINE_ENV, "") or default)
    os.environ[ENGINE_ENV] = chosen.name
    if chosen.tool:
        folder = str(Path(chosen.binaries()[0]).parent)
        os.environ["PATH"] = os.pathsep.join([folder, *os.environ.get("PATH", "").split(os.pathsep)])
    return chosen


def require_binaries(selected: Engine | None = None) -> tuple[str, str]:
    """``prometheus`` and ``promtool`` of ``selected`` (default: :func:`engine`'s choice)."""
    return (selected or engine()).binaries()


@dataclass(frozen=True)
class ScrapeJob:
    name: str
    targets: Sequence[str]
    """``host:port`` of each target."""
    interval: str = "15s"
    scheme: str = "http"
    honor_labels: bool = True
    metrics_path: str = "/metrics"
    labels: dict[str, str] = field(default_factory=dict)
    metric_relabel_configs: Sequence[dict[str, object]] = ()
    """Prometheus ``metric_relabel_configs`` (e.g. drop ``job``/``instance`` so live samples continue
    backfilled series that carry neither)."""
    extra: dict[str, object] = field(default_factory=dict)
    """More keys of the job's entry as given (``scrape_protocols``, Prometheus 3's
    ``metric_name_escaping_scheme``, …)."""


def scrape_configs(scrape_jobs: Sequence[ScrapeJob]) -> list[dict[str, object]]:
    """Prometheus' ``scrape_configs`` entries for ``scrape_jobs`` (also VictoriaMetrics' ``-promscrape.config``)."""
    jobs = []
    for job in scrape_jobs:
        static: dict[str, object] = {"targets": list(job.targets)}
        if job.labels:
            static["labels"] = dict(job.labels)
        entry: dict[str, object] = {
            "job_name": job.name,
            "scrape_interval": job.interval,
            "scheme": job.scheme,
            "metrics_path": job.metrics_path,
            "honor_labels": job.honor_labels,
            "static_configs": [static],
        }
        if job.metric_relabel_configs:
            entry["metric_relabel_configs"] = [dict(c) for c in job.metric_relabel_configs]
        entry.update(job.extra)
        jobs.append(entry)
    return jobs


def backfill_openmetrics(
    source: Path, data_dir: Path, *, block_duration: str = "", selected: Engine | None = None
) -> None:
    """Turn an OpenMetrics file (ending in ``# EOF``) into TSDB blocks under ``data_dir``."""
    _, tool = require_binaries(selected)
    data_dir.mkdir(parents=True, exist_ok=True)
    cmd = [tool, "tsdb", "create-blocks-from", "openmetrics"]
    if block_duration:
        cmd.append(f"--max-block-duration={block_duration}")
    cmd += [str(source), str(data_dir)]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        tail = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["no output"]
        raise PrometheusError(f"promtool create-blocks-from openmetrics {source} failed: {tail[0]}")


class PrometheusServer(LoopbackServer):
    """A real Prometheus on 127.0.0.1:<free port>. Use as a context manager."""

    error = PrometheusError

    def __init__(
        self,
        data_dir: Path,
        *,
        rule_files: Sequence[Path] = (),
        scrape_jobs: Sequence[ScrapeJob] = (),
        port: int | None = None,
        scrape_interval: str = "15s",
        evaluation_interval: str = "15s",
        extra_args: Sequence[str] = (),
        log_file: Path | None = None,
        selected: Engine | None = None,
        alerting: dict[str, object] | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.engine = selected or engine()
        self.alerting = alerting
        """Prometheus' ``alerting`` section (``devkit.alertmanager.alerting_config``), if any."""
        self.port = port or free_port()
        self.rule_files = [Path(p).resolve() for p in rule_files]
        self.scrape_jobs = list(scrape_jobs)
        self.scrape_interval = scrape_interval
        self.evaluation_interval = evaluation_interval
        self.extra_args = list(extra_args)
        self.log_file = log_file or data_dir.parent / f"prometheus-{self.port}.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def config(self) -> dict[str, object]:
        cfg: dict[str, object] = {
            "global": {
                "scrape_interval": self.scrape_interval,
                "evaluation_interval": self.evaluation_interval,
            },
            "rule_files": [str(p) for p in self.rule_files],
            "scrape_configs": scrape_configs(self.scrape_jobs),
        }
        if self.alerting:
            cfg["alerting"] = self.alerting
        return cfg

    def version(self) -> str:
        """The running server's release, from ``/api/v1/status/buildinfo`` (``2.42.0``, ``3.13.5``)."""
        with urllib.request.urlopen(f"{self.url}/api/v1/status/buildinfo", timeout=10) as r:
            return str(json.load(r)["data"]["version"])

    def start(self, *, timeout: float = 60.0) -> PrometheusServer:
        prom, _ = self.engine.binaries()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cfg = self.data_dir.parent / f"prometheus-{self.port}.yml"
        cfg.write_text(yaml.safe_dump(self.config(), sort_keys=False))
        cmd = [
            prom,
            f"--config.file={cfg}",
            f"--storage.tsdb.path={self.data_dir}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--storage.tsdb.retention.time=3650d",
            "--web.enable-lifecycle",
            "--log.level=warn",
            *self.extra_args,
        ]
        self._launch(cmd, name="prometheus", health_path="/-/ready", timeout=timeout)
        return self

    def reload(self) -> None:
        """Re-read config and rule files (``/-/reload``)."""
        cfg = self.data_dir.parent / f"prometheus-{self.port}.yml"
        cfg.write_text(yaml.safe_dump(self.config(), sort_keys=False))
        req = urllib.request.Request(f"{self.url}/-/reload", method="POST")
        with urllib.request.urlopen(req, timeout=10):
            pass
