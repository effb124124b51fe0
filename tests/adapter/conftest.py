"""Shared fixtures for the adapter tests: a real Prometheus (backfilled + one live target), a test
PKI, and an in-process adapter on a free port."""

from __future__ import annotations

import shutil
import threading
import time
import wsgiref.simple_server
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import requests
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from adapter.config.settings import AuthSettings, PrometheusSettings, ServeSettings, TlsSettings
from adapter.serving.app import Adapter
from devkit.prometheus import PrometheusServer, ScrapeJob, backfill_openmetrics, free_port
from tests.support.adapter import data
from tests.support.adapter.pki import Pki, make_pki


@dataclass
class LiveTarget:
    registry: CollectorRegistry
    port: int
    shutdown: Callable[[], None]


@dataclass
class PromEnv:
    server: PrometheusServer
    live: LiveTarget

    @property
    def url(self) -> str:
        return self.server.url


class _QuietHandler(wsgiref.simple_server.WSGIRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


def _text_exposition_server(port: int, registry: CollectorRegistry) -> wsgiref.simple_server.WSGIServer:
    """The live target, always in the text format (0.0.4): prometheus_client answers Prometheus'
    OpenMetrics Accept header with colons escaped to underscores in sample names, so a scraped
    ``gpupilot:fleet_waste:gpu_equivalents`` would arrive as ``gpupilot_fleet_waste_gpu_equivalents``
    and the recording-rule-named series would stop at the backfill's end."""

    def app(_environ: object, start_response: Callable[..., object]) -> list[bytes]:
        start_response("200 OK", [("Content-Type", CONTENT_TYPE_LATEST)])
        return [generate_latest(registry)]

    server = wsgiref.simple_server.make_server("127.0.0.1", port, app, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="live-target", daemon=True).start()
    return server


@pytest.fixture(scope="session")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PromEnv]:
    root = tmp_path_factory.mktemp("adapter-prom")
    registry = CollectorRegistry()
    registry.register(data.LiveCluster())
    port = free_port()
    target = {"job": "live", "instance": f"127.0.0.1:{port}"}
    source = data.write_openmetrics(root / "cluster.om.txt", now=time.time(), target=target)
    backfill_openmetrics(source, root / "data")
    http_server = _text_exposition_server(port, registry)
    live = LiveTarget(registry, port, http_server.shutdown)
    server = PrometheusServer(
        root / "data",
        scrape_jobs=[ScrapeJob("live", [f"127.0.0.1:{port}"], interval="1s")],
        scrape_interval="1s",
    )
    with server:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            query = {"query": 'DCGM_FI_DEV_GPU_UTIL{job="live"}'}
            r = requests.get(f"{server.url}/api/v1/query", params=query, timeout=5).json()
            if r["data"]["result"]:
                break
            time.sleep(0.3)
        else:
            raise RuntimeError(f"the live target was not scraped within 60 s; see {server.log_file}")
        yield PromEnv(server, live)
    http_server.shutdown()


@pytest.fixture(scope="module")
def kubectl_present() -> None:
    """kubectl is part of the development machines (DESIGN.md); its absence is a failure, not a skip.
    Modules that run kubectl ask for it: ``pytestmark = pytest.mark.usefixtures("kubectl_present")``."""
    assert shutil.which("kubectl"), "kubectl is needed for these tests: install it and rerun"


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def base_settings(prom_url: str, pki: Pki, **overrides: object) -> ServeSettings:
    settings = ServeSettings(
        prometheus=PrometheusSettings(url=prom_url, timeout=3.0),
        tls=TlsSettings(pki.server.cert, pki.server.key),
        auth=AuthSettings(
            client_ca_file=pki.client_ca.path,
            requestheader_client_ca_file=pki.front_proxy_ca.path,
            requestheader_allowed_names=("front-proxy-client",),
            authorization_mode="none",
        ),
        bind_address="127.0.0.1",
        secure_port=free_port(),
        pod_source="prometheus",
        discovery_interval=1.0,
        config_check_interval=0.2,
    )
    return replace(settings, **overrides)  # type: ignore[arg-type]


@pytest.fixture
def start_adapter() -> Iterator[Callable[[ServeSettings], Adapter]]:
    started: list[Adapter] = []

    def start(settings: ServeSettings) -> Adapter:
        adapter = Adapter(settings)
        adapter.start()
        started.append(adapter)
        return adapter

    yield start
    for a in started:
        a.stop()


@dataclass
class Client:
    """requests against the adapter as the aggregation layer would call it (front-proxy cert + headers)."""

    base: str
    pki: Pki

    def get(
        self,
        path: str,
        *,
        cert: tuple[Path, Path] | None = None,
        headers: dict[str, str] | None = None,
        params: dict[str, str] | None = None,
    ) -> requests.Response:
        return requests.get(
            self.base + path,
            cert=(str(cert[0]), str(cert[1])) if cert else None,
            headers=headers,
            params=params,
            verify=str(self.pki.serving_ca.path),
            timeout=10,
        )

    def as_hpa(self, path: str, params: dict[str, str] | None = None) -> requests.Response:
        return self.get(
            path,
            cert=(self.pki.front_proxy.cert, self.pki.front_proxy.key),
            headers={
                "X-Remote-User": "system:serviceaccount:kube-system:horizontal-pod-autoscaler",
                "X-Remote-Group": "system:serviceaccounts",
            },
            params=params,
        )


@pytest.fixture
def adapter_client(prom: PromEnv, pki: Pki, start_adapter: Callable[[ServeSettings], Adapter]) -> Client:
    adapter = start_adapter(base_settings(prom.url, pki))
    return Client(f"https://127.0.0.1:{adapter.port}", pki)
