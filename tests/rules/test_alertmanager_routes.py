"""rules/alerts.rules.yaml on a real Prometheus 3 sends its alerts to a real Alertmanager (API v2)
routed by examples/alertmanager.yaml: each severity reaches its receiver with the labels the routes
group and inhibit on, and a critical alert silences a lesser one of the same GPU.

History for three alerts that fire without a ``for`` (an idle MIG slice over 26 hours, a GPU with
double-bit ECC errors, Xid errors on two GPUs) is backfilled around now; Prometheus evaluates
every second, Alertmanager's group wait is cut to one second, and webhook receivers in this process
record what arrives."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from devkit import alertmanager, gobuild
from devkit.prometheus import ENGINES, LTS, Engine, PrometheusServer, backfill_openmetrics, engine

pytestmark = [pytest.mark.compat, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
ROUTES = REPO / "examples" / "alertmanager.yaml"
RULES = REPO / "rules" / "alerts.rules.yaml"

SLICE = {
    "Hostname": "node-a",
    "gpu": "0",
    "UUID": "GPU-aaaa",
    "GPU_I_PROFILE": "1g.10gb",
    "GPU_I_ID": "9",
    "namespace": "team-idle",
    "pod": "notebook-0",
}
ECC_GPU = {"Hostname": "node-b", "gpu": "1", "UUID": "GPU-bbbb", "modelName": "NVIDIA H100 80GB HBM3"}
XID_GPU = {"Hostname": "node-c", "gpu": "2", "UUID": "GPU-cccc", "modelName": "NVIDIA H100 80GB HBM3"}


def _labels(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def _history(now: float) -> str:
    """OpenMetrics, one sample a minute: 26 h of an idle allocated slice; 30 minutes of an ECC count
    and of Xid counters, one of them rising 4 minutes ago. The samples run 10 minutes past ``now``
    (a query sees none of them before their time), so the alerts stay active however long the
    machine takes to start the servers."""
    start = now - now % 60
    end = start + 600
    day = [end - i * 60 for i in range(26 * 60 + 10, -1, -1)]
    recent = [t for t in day if t >= start - 1800]
    info = {k: SLICE[k] for k in ("Hostname", "UUID", "GPU_I_ID", "namespace", "pod")}
    gpu_info = [{k: g[k] for k in ("Hostname", "UUID", "gpu", "modelName")} for g in (ECC_GPU, XID_GPU)]
    out = ["# TYPE gpupilot:slice_activity:avg5m gauge"]
    out += [f"gpupilot:slice_activity:avg5m{_labels(SLICE)} 0.01 {t:.0f}" for t in day]
    out += ["# TYPE gpupilot_device_pod_info gauge"]
    out += [f"gpupilot_device_pod_info{_labels(info)} 1 {t:.0f}" for t in day]
    out += ["# TYPE gpupilot_gpu_info gauge"]
    out += [f"gpupilot_gpu_info{_labels(g)} 1 {t:.0f}" for g in gpu_info for t in recent]
    out += ["# TYPE DCGM_FI_DEV_ECC_DBE_VOL_TOTAL gauge"]
    out += [f"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{_labels(ECC_GPU)} 2 {t:.0f}" for t in recent]
    out += ["# TYPE gpupilot_xid_errors counter"]
    for gpu in (ECC_GPU, XID_GPU):
        labels = {k: gpu[k] for k in ("Hostname", "gpu", "UUID")} | {"xid": "79"}
        out += [f"gpupilot_xid_errors_total{_labels(labels)} {int(t > start - 240)} {t:.0f}" for t in recent]
    return "\n".join(out) + "\n# EOF\n"


class _Receivers:
    """Webhook receivers on one loopback port: ``/<receiver name>`` records each notification."""

    def __init__(self) -> None:
        self.received: dict[str, list[dict[str, Any]]] = {}
        self.lock = threading.Lock()
        receivers = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with receivers.lock:
                    receivers.received.setdefault(self.path.strip("/"), []).append(body)
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/{name}"

    def alerts(self, name: str) -> list[dict[str, Any]]:
        with self.lock:
            return [a for note in self.received.get(name, []) for a in note["alerts"]]


def _prometheus3() -> Engine:
    """The selected Prometheus when it is a 3.x (``make compat`` runs both), else the LTS."""
    chosen = engine()
    return chosen if chosen.major >= 3 else ENGINES[LTS]


def _routes(receivers: _Receivers) -> dict[str, Any]:
    """examples/alertmanager.yaml as shipped, with its webhooks pointed here and the waits cut."""
    config: dict[str, Any] = yaml.safe_load(ROUTES.read_text())
    for receiver in config["receivers"]:
        for hook in receiver["webhook_configs"]:
            hook["url"] = receivers.url(receiver["name"])
    config["route"]["group_wait"] = "1s"
    return config


@pytest.fixture(scope="module")
def delivered(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[_Receivers, alertmanager.AlertmanagerServer, str]]:
    base = tmp_path_factory.mktemp("alertmanager")
    source = base / "history.om"
    source.write_text(_history(time.time()))
    prom3 = _prometheus3()
    backfill_openmetrics(source, base / "data", selected=prom3)
    receivers = _Receivers()
    try:
        with alertmanager.AlertmanagerServer(base / "am", _routes(receivers)) as am:
            prom = PrometheusServer(
                base / "data",
                rule_files=[RULES],
                evaluation_interval="1s",
                alerting=alertmanager.alerting_config(am.url),
                log_file=base / "prometheus.log",
                selected=prom3,
            )
            with prom:
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline and not all(
                    receivers.alerts(r) for r in ("gpu-oncall", "gpu-tickets", "gpu-rightsizing")
                ):
                    time.sleep(0.5)
                yield receivers, am, prom.version()
    finally:
        receivers.server.shutdown()


def _by_name(alerts: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    return {a["labels"]["alertname"]: a["labels"] for a in alerts}


def test_each_severity_reaches_its_receiver_with_the_labels_its_route_needs(
    delivered: tuple[_Receivers, alertmanager.AlertmanagerServer, str],
) -> None:
    receivers, _, _ = delivered
    oncall = _by_name(receivers.alerts("gpu-oncall"))
    tickets = _by_name(receivers.alerts("gpu-tickets"))
    hints = _by_name(receivers.alerts("gpu-rightsizing"))
    assert set(oncall) == {"GPUDoubleBitECCErrors"}, oncall
    assert set(tickets) == {"GPUXidError"}, tickets
    assert set(hints) == {"MIGSliceIdle24h"}, hints
    assert oncall["GPUDoubleBitECCErrors"].items() >= ECC_GPU.items() | {("severity", "critical")}
    assert tickets["GPUXidError"].items() >= {("Hostname", "node-c"), ("gpu", "2"), ("severity", "warning")}
    assert tickets["GPUXidError"]["xid"] == "79"
    assert hints["MIGSliceIdle24h"].items() >= SLICE.items() | {("severity", "info")}


def test_the_critical_alert_silences_the_warning_of_the_same_gpu(
    delivered: tuple[_Receivers, alertmanager.AlertmanagerServer, str],
) -> None:
    receivers, am, _ = delivered
    xid = [a for a in am.alerts() if a["labels"]["alertname"] == "GPUXidError"]
    state = {a["labels"]["Hostname"]: a["status"] for a in xid}
    assert set(state) == {"node-b", "node-c"}, "both GPUs' Xid alerts reached Alertmanager"
    assert state["node-b"]["state"] == "suppressed" and state["node-b"]["inhibitedBy"]
    assert state["node-c"]["state"] == "active"
    assert all(a["labels"]["Hostname"] != "node-b" for a in receivers.alerts("gpu-tickets"))


def test_it_ran_on_the_selected_prometheus_and_a_current_alertmanager(
    delivered: tuple[_Receivers, alertmanager.AlertmanagerServer, str],
) -> None:
    _, am, prometheus_version = delivered
    assert am.version() == gobuild.ALERTMANAGER_RELEASE
    assert prometheus_version == _prometheus3().release
