"""Run a real Alertmanager (built from its Go module by ``devkit.gobuild``) for tests and the demo.

:class:`AlertmanagerServer` starts ``alertmanager`` on a free loopback port with clustering off,
over a configuration document (typically ``examples/alertmanager.yaml`` with its receivers pointed at
the test's webhook), waits for ``/-/ready`` and reads what it holds through the v2 API (the only one
Alertmanager 0.27+ and Prometheus 3 speak). :func:`alerting_config` is what a Prometheus needs to
send it alerts.
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from devkit import gobuild
from devkit.process import LoopbackServer, free_port


class AlertmanagerError(RuntimeError):
    pass


def require_binary() -> str:
    try:
        return str(gobuild.binary("alertmanager", "alertmanager"))
    except gobuild.GoToolError as exc:
        raise AlertmanagerError(str(exc)) from None


def alerting_config(url: str) -> dict[str, object]:
    """A Prometheus ``alerting`` section sending to the Alertmanager at ``url`` (API v2)."""
    host = url.removeprefix("http://").removeprefix("https://")
    return {"alertmanagers": [{"api_version": "v2", "static_configs": [{"targets": [host]}]}]}


class AlertmanagerServer(LoopbackServer):
    """A real Alertmanager on 127.0.0.1:<free port>. Use as a context manager."""

    error = AlertmanagerError

    def __init__(self, work_dir: Path, config: dict[str, Any], *, log_file: Path | None = None) -> None:
        self.work_dir = work_dir
        self.config = config
        self.port = free_port()
        self.log_file = log_file or work_dir / f"alertmanager-{self.port}.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, *, timeout: float = 60.0) -> AlertmanagerServer:
        binary = require_binary()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        cfg = self.work_dir / f"alertmanager-{self.port}.yml"
        cfg.write_text(yaml.safe_dump(self.config, sort_keys=False))
        cmd = [
            binary,
            f"--config.file={cfg}",
            f"--storage.path={self.work_dir / f'data-{self.port}'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--cluster.listen-address=",  # one instance: no gossip port
            "--log.level=warn",
        ]
        self._launch(cmd, name="alertmanager", health_path="/-/ready", timeout=timeout)
        return self

    def alerts(self) -> list[dict[str, Any]]:
        """The alerts it holds (``GET /api/v2/alerts``), each with ``labels`` and ``receivers``."""
        with urllib.request.urlopen(f"{self.url}/api/v2/alerts", timeout=10) as r:
            body: list[dict[str, Any]] = json.load(r)
        return body

    def version(self) -> str:
        with urllib.request.urlopen(f"{self.url}/api/v2/status", timeout=10) as r:
            return str(json.load(r)["versionInfo"]["version"])
