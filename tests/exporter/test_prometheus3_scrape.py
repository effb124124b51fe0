"""The exporter scraped by Prometheus 3 (the LTS and the newest) with its default scrape protocols and
no ``fallback_scrape_protocol``: every scrape succeeds, the same series and metadata arrive as on
Debian's 2.42, in both formats the exporter speaks, and under each name-escaping scheme Prometheus 3
can ask for.

Two exporters on the frozen simulator (values do not move): the default field set, whose DCGM
counters keep their names without ``_total`` so the exporter answers in the text format whatever
the client prefers (as dcgm-exporter does), and a gauge-only field set, which it answers in
OpenMetrics when the client prefers it. A tap in front of each records the ``Accept`` header every
Prometheus sent and the ``Content-Type`` it got back.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests

from devkit.prometheus import ENGINES, PrometheusServer, ScrapeJob
from exporter.collect.collector import Collector
from exporter.contract import counters
from exporter.contract.layout import SeriesLayout
from exporter.serve.server import MetricsServer
from exporter.settings import CollectorSettings
from simulator import scenario as scenario_mod
from simulator.backend import SimBackend
from tests.support.promquery import instant

pytestmark = [pytest.mark.compat, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "examples" / "fleet-demo.yaml"
NODE = "gpu-h100-a"
ENGINE_NAMES = ("2.42", "3.13", "3.16")
GAUGES_ONLY = """\
DCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C).
DCGM_FI_DEV_FB_USED, gauge, Framebuffer memory used (in MiB).
DCGM_FI_DEV_FB_FREE, gauge, Framebuffer memory free (in MiB).
DCGM_FI_PROF_GR_ENGINE_ACTIVE, gauge, Ratio of time the graphics engine is active.
"""
ESCAPING = ("underscores", "dots", "values")
"""Prometheus 3's ``metric_name_escaping_scheme`` values besides its default (``allow-utf-8``); each
is asked of the default exporter by a job with ``metric_name_validation_scheme: legacy``."""
CHANGING = {"gpupilot_exporter_snapshot_age_seconds", "scrape_duration_seconds", "scrape_series_added"}
"""Series whose value moves between scrapes even on a frozen simulator."""
SCRAPES = 4
"""Scrapes of every job on every server before the checks."""


@dataclass
class Tap:
    """A forwarding proxy in front of one exporter, recording ``(Accept, Content-Type)`` per scrape."""

    upstream: int
    seen: list[tuple[str, str]] = field(default_factory=list)

    def start(self) -> int:
        tap = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                accept = self.headers.get("Accept", "")
                req = urllib.request.Request(
                    f"http://127.0.0.1:{tap.upstream}{self.path}",
                    headers={"Accept": accept, "Accept-Encoding": self.headers.get("Accept-Encoding", "")},
                )
                with urllib.request.urlopen(req, timeout=10) as r:
                    body, ctype, enc = (
                        r.read(),
                        r.headers.get("Content-Type", ""),
                        r.headers.get("Content-Encoding"),
                    )
                tap.seen.append((accept, ctype))
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                if enc:
                    self.send_header("Content-Encoding", enc)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return int(self.server.server_address[1])


@dataclass(frozen=True)
class Scraped:
    url: str
    version: str
    taps: dict[str, Tap]


def _exporter(scenario: Any, layout: SeriesLayout) -> tuple[Collector, MetricsServer]:
    frozen = scenario.epoch + 15 * 3600
    backend = SimBackend(scenario, node=NODE, clock=lambda: frozen)
    collector = Collector(
        backend,
        hostname=NODE,
        settings=CollectorSettings(interval=1.0, collect_timeout=1.0),
        allocations=backend.allocations,
        layout=layout,
    )
    collector.collect_once()
    server = MetricsServer(collector, host="127.0.0.1", port=0)
    server.start()
    return collector, server


def _jobs(ports: dict[str, int], major: int) -> list[ScrapeJob]:
    jobs = [
        ScrapeJob(name=name, targets=[f"127.0.0.1:{port}"], interval="1s") for name, port in ports.items()
    ]
    if major >= 3:
        jobs += [
            ScrapeJob(
                name=f"escaping-{scheme}",
                targets=[f"127.0.0.1:{ports['text']}"],
                interval="1s",
                extra={"metric_name_validation_scheme": "legacy", "metric_name_escaping_scheme": scheme},
            )
            for scheme in ESCAPING
        ]
    return jobs


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Scraped]]:
    scenario = scenario_mod.load(SCENARIO)
    csv = tmp_path_factory.mktemp("counters") / "gauges.csv"
    csv.write_text(GAUGES_ONLY)
    gauges = SeriesLayout(selection=counters.select(counters.load(csv)))
    exporters = {"text": _exporter(scenario, SeriesLayout()), "openmetrics": _exporter(scenario, gauges)}
    assert (
        not exporters["text"][0].page.openmetrics_safe and exporters["openmetrics"][0].page.openmetrics_safe
    )
    out: dict[str, Scraped] = {}
    servers: list[PrometheusServer] = []
    try:
        for name in ENGINE_NAMES:
            taps = {kind: Tap(server.port) for kind, (_, server) in exporters.items()}
            ports = {kind: tap.start() for kind, tap in taps.items()}
            prom = PrometheusServer(
                tmp_path_factory.mktemp(f"prom-{name}") / "data",
                scrape_jobs=_jobs(ports, ENGINES[name].major),
                scrape_interval="1s",
                selected=ENGINES[name],
            ).start()
            servers.append(prom)
            out[name] = Scraped(prom.url, prom.version(), taps)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not all(
            _scrapes_each(run.url) >= SCRAPES for run in out.values()
        ):
            time.sleep(0.5)
        yield out
    finally:
        for prom in servers:
            prom.stop()
        for collector, server in exporters.values():
            server.stop()
            collector.stop()


def _scrapes_each(url: str) -> float:
    """The fewest scrapes any job of the server has made."""
    rows = instant(url, "min(count_over_time(up[1h]))")
    return float(rows[0]["value"][1]) if rows else 0.0


def _series(url: str, job: str) -> dict[tuple[tuple[str, str], ...], str]:
    got = {}
    for row in instant(url, f'{{job="{job}"}}'):
        labels = dict(row["metric"])
        labels.pop("job"), labels.pop("instance")
        value = "changing" if labels["__name__"] in CHANGING else row["value"][1]
        got[tuple(sorted(labels.items()))] = value
    return got


@pytest.mark.parametrize("name", ENGINE_NAMES)
def test_every_scrape_succeeds_with_the_default_protocols(scraped: dict[str, Scraped], name: str) -> None:
    run = scraped[name]
    assert run.version.startswith(name) or (name == "2.42" and run.version.startswith("2.")), run.version
    targets = requests.get(f"{run.url}/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
    assert targets and all(t["health"] == "up" and t["lastError"] == "" for t in targets), targets
    at = time.time()  # both queries at one moment: a scrape between them is no failure
    for target in targets:
        job = target["labels"]["job"]
        scrapes = instant(run.url, f'count_over_time(up{{job="{job}"}}[1h])', at)
        ok = instant(run.url, f'sum_over_time(up{{job="{job}"}}[1h])', at)
        assert float(scrapes[0]["value"][1]) >= SCRAPES, job
        assert ok[0]["value"][1] == scrapes[0]["value"][1], f"{job}: failed scrapes on Prometheus {name}"


@pytest.mark.parametrize("name", ["3.13", "3.16"])
@pytest.mark.parametrize("job", ["text", "openmetrics"])
def test_prometheus_3_holds_the_same_series_as_2_42(scraped: dict[str, Scraped], name: str, job: str) -> None:
    reference = _series(scraped["2.42"].url, job)
    assert len(reference) > (100 if job == "text" else 10)
    got = _series(scraped[name].url, job)
    missing, extra = set(reference) - set(got), set(got) - set(reference)
    assert not missing and not extra, (
        f"Prometheus {name}, {job}: missing {sorted(missing)[:5]}, extra {sorted(extra)[:5]}"
    )
    changed = {k: (reference[k], got[k]) for k in reference if reference[k] != got[k]}
    assert not changed, f"Prometheus {name}, {job}: values differ: {list(changed.items())[:5]}"


@pytest.mark.parametrize("name", ["3.13", "3.16"])
def test_metadata_types_agree_with_2_42(scraped: dict[str, Scraped], name: str) -> None:
    def types(url: str) -> dict[str, list[str]]:
        meta = requests.get(f"{url}/api/v1/metadata", timeout=10).json()["data"]
        return {
            k: sorted({m["type"] for m in v}) for k, v in meta.items() if k.startswith(("DCGM_", "gpupilot_"))
        }

    reference = types(scraped["2.42"].url)
    assert reference["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == ["counter"]
    assert types(scraped[name].url) == reference


@pytest.mark.parametrize("name", ["3.13", "3.16"])
def test_content_type_is_negotiated_as_prometheus_3_asks(scraped: dict[str, Scraped], name: str) -> None:
    """Prometheus 3 offers OpenMetrics first, then the text formats; the exporter answers OpenMetrics
    only where the page is valid OpenMetrics, the text format 0.0.4 otherwise, and never a
    Content-Type Prometheus did not offer (which Prometheus 3 would refuse without a fallback)."""
    taps = scraped[name].taps
    for kind, wanted in (("text", "text/plain"), ("openmetrics", "application/openmetrics-text")):
        seen = taps[kind].seen
        assert seen, kind
        for accept, ctype in seen:
            assert "application/openmetrics-text" in accept and "text/plain" in accept, accept
            assert ctype.split(";")[0] == wanted, (kind, accept, ctype)
            assert ctype.split(";")[0] in accept
    escaped = [accept for accept, _ in taps["text"].seen if "escaping=underscores" in accept]
    assert escaped, "a legacy-validation job asks for escaping=underscores"


@pytest.mark.parametrize("name", ["3.13", "3.16"])
@pytest.mark.parametrize("scheme", ESCAPING)
def test_every_escaping_scheme_yields_the_same_series(
    scraped: dict[str, Scraped], name: str, scheme: str
) -> None:
    """Every name and label the exporter publishes is a legacy Prometheus name, so whichever escaping
    Prometheus 3 asks for, nothing is renamed."""
    url = scraped[name].url
    assert _series(url, f"escaping-{scheme}") == _series(url, "text")
