"""gpupilot_build_info{version, service, python_version} 1 on every service's /metrics."""

from __future__ import annotations

import platform
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from adapter.serving.selfmetrics import SelfMetrics
from gpupilot_common.cli import package_version
from rightsizer.serve import status
from rightsizer.serve.state import State

ROOT = Path(__file__).resolve().parents[2]


def build_info(text: str) -> dict[str, str]:
    (family,) = [f for f in text_string_to_metric_families(text) if f.name == "gpupilot_build_info"]
    (sample,) = family.samples
    assert sample.value == 1.0
    return dict(sample.labels)


def expected(service: str) -> dict[str, str]:
    return {"version": package_version(), "service": service, "python_version": platform.python_version()}


def test_adapter() -> None:
    assert build_info(SelfMetrics().exposition().decode()) == expected("adapter")


def test_rightsizer() -> None:
    class Families(Collector):
        def collect(self) -> Iterator[Metric]:
            return status.metric_families(State(), Counter())

    reg = CollectorRegistry()
    reg.register(Families())
    assert build_info(generate_latest(reg).decode()) == expected("rightsizer")


def test_exporter() -> None:
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "exporter",
            "--backend",
            "sim",
            "--scenario",
            str(ROOT / "examples" / "fleet-demo.yaml"),
            "--once",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert build_info(res.stdout) == expected("exporter")
