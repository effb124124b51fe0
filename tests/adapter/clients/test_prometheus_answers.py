"""adapter.clients.prometheus reads answers through the shared reader: Prometheus' own error text
on an HTTP 200, truncated JSON called truncated, an answer over the limits refused while it is
read, NaN/Inf passed on for the door to count — each a 503 line, counted in
gpupilot_adapter_prometheus_errors_total (a small HTTP server on 127.0.0.1 answers)."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from adapter.clients.prometheus import PrometheusClient, PrometheusMetrics
from adapter.errors import PrometheusUnavailable
from gpupilot_common import promanswer


class Answers(http.server.BaseHTTPRequestHandler):
    """Answers every request (the adapter POSTs its queries) with the class's ``body``."""

    body = b"{}"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def fake() -> Iterator[tuple[type[Answers], str]]:
    handler = type("Handler", (Answers,), {})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield handler, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def vector(values: list[str]) -> bytes:
    result = [{"metric": {"pod": f"p{i}"}, "value": [1, v]} for i, v in enumerate(values)]
    doc = {"status": "success", "data": {"resultType": "vector", "result": result}}
    return json.dumps(doc, separators=(",", ":")).encode()


def client(url: str, registry: CollectorRegistry, **kw: object) -> PrometheusClient:
    return PrometheusClient(url, registry_metrics=PrometheusMetrics(registry), **kw)  # type: ignore[arg-type]


def errors(registry: CollectorRegistry) -> float:
    return registry.get_sample_value("gpupilot_adapter_prometheus_errors_total", {"purpose": "value"}) or 0.0


@pytest.mark.slow
def test_prometheus_own_error_text_on_an_http_200(fake: tuple[type[Answers], str]) -> None:
    answers, url = fake
    answers.body = (
        b'{"status":"error","errorType":"execution","error":"query timed out in expression evaluation"}'
    )
    registry = CollectorRegistry()
    c = client(url, registry)
    try:
        with pytest.raises(PrometheusUnavailable) as err:
            c.query("up")
    finally:
        c.close()
    assert str(err.value) == (
        f"Prometheus at {url} refused the query (execution: query timed out in expression evaluation)"
    )
    assert errors(registry) == 1


@pytest.mark.slow
def test_truncated_and_oversized_answers(fake: tuple[type[Answers], str]) -> None:
    answers, url = fake
    registry = CollectorRegistry()
    c = client(url, registry, limits=promanswer.AnswerLimits(max_series=5, max_bytes=1 << 20))
    try:
        answers.body = vector(["1", "2"])[:-5]
        with pytest.raises(
            PrometheusUnavailable, match=r"answer is not valid JSON \(truncated after \d+ bytes\)$"
        ):
            c.query("up")
        answers.body = vector(["1"] * 50)
        with pytest.raises(PrometheusUnavailable) as err:
            c.query('sum by (pod) (x{namespace="ml"})')
        assert str(err.value) == (
            f"Prometheus at {url}: the answer to 'sum by (pod) (x{{namespace=\"ml\"}})' holds more than 5 "
            "series (--max-answer-series); narrow the query or raise the limit"
        )
        answers.body = vector(["NaN", "+Inf", "0.5"])
        got = [s.value for s in c.query("up")]
        assert str(got[0]) == "nan" and got[1:] == [float("inf"), 0.5]  # counted at the door, not here
    finally:
        c.close()
    assert errors(registry) == 2
