"""rightsizer.clients.prometheus on prometheus-api-client: scalars, and each failure as one line of
the right class, against a small HTTP server that answers what a broken Prometheus or a wrong URL
would (the real Prometheus cases are in test_analysis.py)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import pytest

from gpupilot_common.httpserve import HTTPServer, Reply
from rightsizer.clients.prometheus import PrometheusClient, PrometheusQueryError, PrometheusUnavailable


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


def test_5xx_is_unavailable_and_not_retried(fake: tuple[Answers, str]) -> None:
    answers, url = fake
    answers.reply = Reply(503, b"upstream down\n")
    with PrometheusClient(url) as client, pytest.raises(PrometheusUnavailable) as err:
        client.instant("up")
    assert str(err.value) == f"Prometheus at {url} answered HTTP 503 for /api/v1/query"
    assert answers.paths == ["/api/v1/query"]


def test_execution_error_is_a_query_error(fake: tuple[Answers, str]) -> None:
    answers, url = fake
    answers.reply = Reply(
        422,
        b'{"status":"error","errorType":"execution","error":"query processing would load too many samples"}',
    )
    with PrometheusClient(url) as client, pytest.raises(PrometheusQueryError) as err:
        client.range("up", 0, 3600, 60)
    assert (
        str(err.value)
        == f"Prometheus at {url} rejected a query: query processing would load too many samples"
    )


@pytest.mark.parametrize(
    ("status", "body"), [(200, b"<html>Grafana</html>"), (404, b"404 page not found"), (200, b'{"data": 1}')]
)
def test_not_the_prometheus_api_is_one_line(fake: tuple[Answers, str], status: int, body: bytes) -> None:
    answers, url = fake
    answers.reply = Reply(status, body)
    with PrometheusClient(url) as client, pytest.raises(PrometheusQueryError) as err:
        client.instant("up")
    message = str(err.value)
    assert "\n" not in message
    assert (
        message
        == f"{url}/api/v1/query answered HTTP {status} without a Prometheus API body; is the URL right?"
    )
