"""rightsizer.clients.prometheus on prometheus-api-client: scalars, and each failure as one line of
the right class, against a small HTTP server that answers what a broken Prometheus or a wrong URL
would (the real Prometheus cases are in test_analysis.py)."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from gpupilot_common import promanswer
from gpupilot_common.httpserve import HTTPServer, Reply
from rightsizer.cli import main
from rightsizer.clients.prometheus import (
    PrometheusClient,
    PrometheusError,
    PrometheusQueryError,
    PrometheusUnavailable,
)


class Answers:
    """Answers every path with ``reply``; counts the requests."""

    def __init__(self) -> None:
        self.reply = Reply(200, b"{}")
        self.paths: list[str] = []

    def __call__(self, path: str, query: Mapping[str, str]) -> Reply:
        self.paths.append(path)
        return self.reply


@pytest.fixture
def fake() -> Iterator[tuple[Answers, str]]:
    answers = Answers()
    server = HTTPServer(answers).start()
    yield answers, f"http://127.0.0.1:{server.port}"
    server.close()


@pytest.mark.slow
def test_5xx_is_unavailable_and_not_retried(fake: tuple[Answers, str]) -> None:
    answers, url = fake
    answers.reply = Reply(503, b"upstream down\n")
    with PrometheusClient(url) as client, pytest.raises(PrometheusUnavailable) as err:
        client.instant("up")
    assert str(err.value) == f"Prometheus at {url} answered HTTP 503 for /api/v1/query"
    assert answers.paths == ["/api/v1/query"]


@pytest.mark.slow
def test_execution_error_is_a_query_error(fake: tuple[Answers, str]) -> None:
    answers, url = fake
    answers.reply = Reply(
        422,
        b'{"status":"error","errorType":"execution","error":"query processing would load too many samples"}',
    )
    with PrometheusClient(url) as client, pytest.raises(PrometheusQueryError) as err:
        client.range("up", 0, 3600, 60)
    assert str(err.value) == (
        f"Prometheus at {url} refused the query (execution: query processing would load too many samples)"
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("status", "body", "says"),
    [
        (200, b"<html>Grafana</html>", "answered '<html>Grafana</h'…,"),
        (404, b"404 page not found", "answered HTTP 404,"),
        (200, b'{"data": 1}', "answered HTTP 200,"),
    ],
)
def test_not_the_prometheus_api_is_one_line(
    fake: tuple[Answers, str], status: int, body: bytes, says: str
) -> None:
    answers, url = fake
    answers.reply = Reply(status, body)
    with PrometheusClient(url) as client, pytest.raises(PrometheusQueryError) as err:
        client.instant("up")
    message = str(err.value)
    assert "\n" not in message
    assert message == f"{url}/api/v1/query {says} not a Prometheus API body; is the URL right?"


@pytest.mark.slow
def test_an_error_status_in_a_200_answer_keeps_prometheus_own_text(fake: tuple[Answers, str]) -> None:
    answers, url = fake
    answers.reply = Reply(
        200, b'{"status":"error","errorType":"bad_data","error":"invalid parameter \\"query\\""}'
    )
    with PrometheusClient(url) as client, pytest.raises(PrometheusQueryError) as err:
        client.instant("up{")
    assert str(err.value) == f'Prometheus at {url} refused the query (bad_data: invalid parameter "query")'


def test_non_finite_values_are_left_out(fake: tuple[Answers, str]) -> None:
    """NaN, +Inf and -Inf (a ratio over zero) mean no statistic; plan used to end in an
    OverflowError decoding an infinite peak hour."""
    answers, url = fake
    result = [
        {"metric": {"pod": p}, "value": [1700000000, v]}
        for p, v in (("a", "NaN"), ("b", "+Inf"), ("c", "-Inf"), ("d", "0.25"))
    ]
    answers.reply = Reply(
        200, json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()
    )
    with PrometheusClient(url) as client:
        assert [(s.labels["pod"], s.value) for s in client.instant("x")] == [("d", 0.25)]


@pytest.mark.slow
def test_truncated_answer_is_called_truncated(fake: tuple[Answers, str]) -> None:
    answers, url = fake
    answers.reply = Reply(200, b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{}')
    with PrometheusClient(url) as client, pytest.raises(PrometheusQueryError) as err:
        client.instant("x")
    assert str(err.value) == f"{url}/api/v1/query: answer is not valid JSON (truncated after 72 bytes)"


@pytest.mark.slow
def test_an_answer_over_the_series_limit_names_the_query_and_the_flag(fake: tuple[Answers, str]) -> None:
    answers, url = fake
    result = [{"metric": {"pod": f"p{i}"}, "value": [1, "1"]} for i in range(50)]
    answers.reply = Reply(
        200,
        json.dumps(
            {"status": "success", "data": {"resultType": "vector", "result": result}}, separators=(",", ":")
        ).encode(),
    )
    limits = promanswer.AnswerLimits(max_series=10, max_bytes=1 << 20)
    with PrometheusClient(url, limits=limits) as client, pytest.raises(PrometheusQueryError) as err:
        client.range("gpupilot:slice_activity:avg5m", 0, 3600, 60)
    assert str(err.value) == (
        f"Prometheus at {url}: the answer to 'gpupilot:slice_activity:avg5m' holds more than 10 series "
        "(--max-answer-series); narrow the query or raise the limit"
    )


def test_refused_and_timed_out_are_told_apart() -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    with PrometheusClient(f"http://127.0.0.1:{port}") as client, pytest.raises(PrometheusUnavailable) as err:
        client.instant("up")
    assert str(err.value) == (
        f"cannot reach Prometheus at http://127.0.0.1:{port}: connection refused; is it running? "
        "check --prometheus-url"
    )
    with socket.socket() as silent:  # accepts (the kernel's backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        with PrometheusClient(url, timeout=0.3) as client, pytest.raises(PrometheusUnavailable) as err:
            client.instant("up")
    assert str(err.value) == f"Prometheus at {url}: no complete answer, timed out after 0.3 s (--timeout)"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("status", "body", "says"),
    [
        (503, b"upstream down\n", "Prometheus at {url} answered HTTP 503 for /api/v1/query"),
        (404, b"404 page not found", "{url}/api/v1/query answered HTTP 404, not a Prometheus API body"),
    ],
)
def test_a_path_prefix_is_named_once(fake: tuple[Answers, str], status: int, body: bytes, says: str) -> None:
    """Mimir and Thanos serve the API under a prefix: the request carries it once, and so does the
    message (the URL holds it; the API path after it does not repeat it)."""
    answers, url = fake
    answers.reply = Reply(status, body)
    prefixed = f"{url}/prometheus"
    with PrometheusClient(prefixed) as client, pytest.raises(PrometheusError) as err:
        client.instant("up")
    assert answers.paths == ["/prometheus/api/v1/query"]
    assert says.format(url=prefixed) in str(err.value)
    assert "/prometheus/prometheus" not in str(err.value)


@pytest.mark.slow
@pytest.mark.parametrize("command", ["plan", "report"])
def test_plan_and_report_name_a_prefixed_url_once(
    fake: tuple[Answers, str], command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    answers, url = fake
    answers.reply = Reply(503, b"upstream down\n")
    argv = [command, "--prometheus-url", f"{url}/prometheus", "--out", str(tmp_path / "out")]
    assert main(argv) != 0
    err = capsys.readouterr().err
    assert f"Prometheus at {url}/prometheus answered HTTP 503 for /api/v1/query" in err, err
    assert "/prometheus/prometheus" not in err
    assert answers.paths and all(p.startswith("/prometheus/api/v1/") for p in answers.paths)
