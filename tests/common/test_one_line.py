"""The issue's traceback cases, each now one line and the right exit code: a backfill --out that is
a file, bad HPA quantities, unparsable or unreadable flags, a Prometheus answering a sample value
of "abc", a Kubernetes API answering HTML."""

from __future__ import annotations

import http.server
import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from adapter import cli as adapter_cli
from adapter.clients.kube import KubeClient
from adapter.clients.prometheus import PrometheusClient as AdapterPrometheus
from adapter.errors import KubernetesUnavailable, PrometheusUnavailable
from exporter.commands import cli as exporter_cli
from rightsizer.clients.kube import Kube, PermanentKubeError
from rightsizer.clients.prometheus import PrometheusClient as RightsizerPrometheus
from rightsizer.clients.prometheus import PrometheusQueryError

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "tests" / "data" / "fleet-small.yaml"
HPA = """apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: web}
spec:
  scaleTargetRef: {kind: Deployment, name: web}
  maxReplicas: 3
  metrics:
  - type: Pods
    pods:
      metric: {name: queue}
      target: {type: AverageValue, averageValue: QUANTITY}
"""


def run(main: object, argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    assert callable(main)
    try:
        rc = int(main(argv))
    except SystemExit as exc:
        rc = int(exc.code or 0)
    out, err = capsys.readouterr()
    assert err.count("\n") == 1, err
    assert "Traceback" not in out + err
    return rc, err


def test_backfill_out_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "blocks"
    target.write_text("not a directory")
    argv = ["backfill", "--scenario", str(SCENARIO), "--days", "0.01", "--out", str(target), "--quiet"]
    rc, err = run(exporter_cli.main, argv, capsys)
    assert rc == 2
    assert f"--out {target}: cannot create the data directory (File exists)" in err


@pytest.mark.parametrize("quantity", ["12zz", "NaN", "1e99999", "Infinity", "zzGi", "[1, 2]"])
def test_bad_hpa_quantity_names_the_field(
    quantity: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hpa = tmp_path / "hpa.yaml"
    hpa.write_text(HPA.replace("QUANTITY", quantity))
    argv = ["explain-hpa", "-f", str(hpa), "--prometheus-url", "http://127.0.0.1:9"]
    rc, err = run(adapter_cli.main, argv, capsys)
    assert rc == 2
    assert f"{hpa}: spec.metrics[0].pods.target.averageValue:" in err
    assert "quantity" in err


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--prometheus-url", "http://[::1"], "argument --prometheus-url: 'http://[::1' is not a URL"),
        (["--prometheus-url", "prometheus:9090"], "expected http(s)://HOST[:PORT][/PATH]"),
        (
            ["--prometheus-url", "http://p", "--prometheus-ca-file", "/nonexistent/ca.pem"],
            "argument --prometheus-ca-file: '/nonexistent/ca.pem': no such file",
        ),
    ],
)
def test_adapter_flags_checked_before_starting(
    flags: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, err = run(adapter_cli.main, ["serve", *flags], capsys)
    assert rc == 2
    assert expected in err


class _Answer(http.server.BaseHTTPRequestHandler):
    body = b""
    content_type = "application/json"

    def _answer(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", self.content_type)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    do_GET = do_POST = do_PATCH = _answer

    def log_message(self, format: str, *args: object) -> None:
        pass


def _serve(body: bytes, content_type: str) -> Iterator[str]:
    handler = type("Handler", (_Answer,), {"body": body, "content_type": content_type})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def abc_prometheus() -> Iterator[str]:
    result = [{"metric": {"__name__": "up"}, "value": [1700000000, "abc"]}]
    body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}})
    yield from _serve(body.encode(), "application/json")


@pytest.fixture
def html_server() -> Iterator[str]:
    yield from _serve(b"<html>\n<body><h1>Welcome to nginx!</h1></body>\n</html>\n", "text/html")


@pytest.mark.slow
def test_prometheus_value_abc_is_one_line(abc_prometheus: str) -> None:
    adapter_client = AdapterPrometheus(abc_prometheus)
    with pytest.raises(PrometheusUnavailable, match="answered with a malformed result") as info:
        adapter_client.query("up")
    adapter_client.close()
    assert "\n" not in str(info.value)
    with (
        RightsizerPrometheus(abc_prometheus) as rightsizer_client,
        pytest.raises(PrometheusQueryError) as err,
    ):
        rightsizer_client.instant("up")
    assert "malformed result" in str(err.value) and "\n" not in str(err.value)
    with RightsizerPrometheus(abc_prometheus) as rightsizer_client, pytest.raises(PrometheusQueryError):
        rightsizer_client.range("up", 0, 60, 15)


@pytest.mark.slow
def test_kubernetes_api_answering_html_is_one_line(html_server: str, tmp_path: Path) -> None:
    cfg = client.Configuration()
    cfg.host = html_server
    kube = Kube(client.ApiClient(cfg))
    with pytest.raises(PermanentKubeError, match="not Kubernetes API JSON") as info:
        kube.get_node("gpu-1")
    assert str(info.value).startswith("node gpu-1: ") and "\n" not in str(info.value)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: k, cluster: {{server: '{html_server}'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    adapter_kube = KubeClient(kubeconfig=str(kubeconfig))
    with pytest.raises(KubernetesUnavailable) as failure:
        adapter_kube.token_review("token")
    assert str(failure.value).startswith("TokenReview failed:") and "\n" not in str(failure.value)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--self-signed-cert-dir", "/proc/gpupilot-no-such-dir"], "cannot use /proc/gpupilot-no-such-dir:"),
        (["--bind-address", "999.1.1.1"], "cannot listen on --bind-address 999.1.1.1 --secure-port"),
        (["--bind-address", "127.0.0.1", "--secure-port", "{busy}"], "Address already in use"),
    ],
    ids=["uncreatable cert dir", "bad bind address", "port in use"],
)
def test_adapter_start_failures_are_one_line(flags: list[str], expected: str, tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        flags = [f.replace("{busy}", port) for f in flags]
        argv = ["serve", "--prometheus-url", "http://127.0.0.1:9", "--authorization-mode", "none"]
        argv += ["--pod-source", "none", "--self-signed-cert-dir", str(tmp_path / "cert"), *flags]
        res = subprocess.run(
            [sys.executable, "-m", "adapter", *argv],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert res.returncode == 2
    errors = [line for line in res.stderr.splitlines() if line.startswith("gpupilot-adapter serve: ")]
    assert len(errors) == 1, res.stderr
    assert expected in errors[0]
    assert "Traceback" not in res.stderr
