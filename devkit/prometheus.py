"""Run a real Prometheus (Debian's package) for tests, the demo and the benchmarks.

``PrometheusServer`` starts ``prometheus`` on a free loopback port over a data directory (which may
hold blocks backfilled with ``promtool tsdb create-blocks-from openmetrics``), with optional scrape
targets and rule files, waits until ``/-/ready`` answers, and stops it cleanly.
"""

from __future__ import annotations

import shutil
import subprocess
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from devkit import process
from devkit.process import LoopbackServer

free_port = process.free_port  # where the tests, the demo and the benchmarks take it from


class PrometheusError(RuntimeError):
    pass


def require_binaries() -> tuple[str, str]:
    prom, tool = shutil.which("prometheus"), shutil.which("promtool")
    if not prom or not tool:
        raise PrometheusError(
            "prometheus/promtool not found: run 'make test' as root or 'sudo apt-get install prometheus'"
        )
    return prom, tool


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
        jobs.append(entry)
    return jobs


def backfill_openmetrics(source: Path, data_dir: Path, *, block_duration: str = "") -> None:
    """Turn an OpenMetrics file (ending in ``# EOF``) into TSDB blocks under ``data_dir``."""
    _, tool = require_binaries()
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
    ) -> None:
        self.data_dir = data_dir
        self.port = port or free_port()
        self.rule_files = [Path(p).resolve() for p in rule_files]
        self.scrape_jobs = list(scrape_jobs)
        self.scrape_interval = scrape_interval
        self.evaluation_interval = evaluation_interval
        self.extra_args = list(extra_args)
        self.log_file = log_file or data_dir.parent / f"prometheus-{self.port}.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def config(self) -> dict[str, object]:
        return {
            "global": {
                "scrape_interval": self.scrape_interval,
                "evaluation_interval": self.evaluation_interval,
            },
            "rule_files": [str(p) for p in self.rule_files],
            "scrape_configs": scrape_configs(self.scrape_jobs),
        }

    def start(self, *, timeout: float = 60.0) -> PrometheusServer:
        prom, _ = require_binaries()
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
