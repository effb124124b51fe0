"""The per-request path's own parts: the request counters and latency histogram (recorded without
prometheus_client's locks, exported through a collector), the memoised query-string parsing (the
same parameters as aiohttp's parser gives), and TLS renegotiation refused (a connection's client
certificate is read once)."""

from __future__ import annotations

import asyncio
import re
import ssl
import threading
from pathlib import Path

import pytest
import yarl
from aiohttp import web

from adapter.serving import server
from adapter.serving.selfmetrics import REQUEST_BUCKETS, SelfMetrics
from adapter.serving.tlsutil import self_signed_pair, server_context


def _samples(text: str, name: str) -> dict[str, float]:
    return {
        labels: float(v) for labels, v in re.findall(rf"^{name}\{{([^}}]*)\}} (\S+)$", text, re.MULTILINE)
    }


def test_request_stats_expose_counts_and_a_consistent_histogram() -> None:
    metrics = SelfMetrics()
    for seconds in (0.0004, 0.001, 0.003, 0.03, 7.0):
        metrics.requests.record("custom", 200, seconds)
    metrics.requests.record("other", 404, 0.0001)
    text = metrics.exposition().decode()
    counts = _samples(text, "gpupilot_adapter_requests_total")
    assert counts == {'code="200",kind="custom"': 5.0, 'code="404",kind="other"': 1.0}
    buckets = _samples(text, "gpupilot_adapter_request_duration_seconds_bucket")
    custom = {k.split('le="')[1].rstrip('"'): v for k, v in buckets.items() if 'kind="custom"' in k}
    # a value equal to a bound counts in that bound's bucket (le: less than or equal)
    assert (custom["0.001"], custom["0.0025"], custom["0.005"], custom["0.05"], custom["2.5"]) == (
        2,
        2,
        3,
        4,
        4,
    )
    assert custom["+Inf"] == 5
    assert list(custom) == [*(repr(b) for b in REQUEST_BUCKETS), "+Inf"]
    assert list(custom.values()) == sorted(custom.values())  # cumulative
    count = _samples(text, "gpupilot_adapter_request_duration_seconds_count")
    total = _samples(text, "gpupilot_adapter_request_duration_seconds_sum")
    assert count['kind="custom"'] == 5
    assert total['kind="custom"'] == pytest.approx(7.0344)


@pytest.mark.slow
def test_request_stats_can_be_read_while_the_loop_records() -> None:
    metrics = SelfMetrics()
    stop = threading.Event()

    def record() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            metrics.requests.record(f"kind{n % 50}", 200 + n % 7, 0.002)

    writer = threading.Thread(target=record)
    writer.start()
    try:
        for _ in range(200):  # new kinds and codes appear while the registry reads them
            text = metrics.exposition().decode()
            buckets = _samples(text, "gpupilot_adapter_request_duration_seconds_bucket")
            for labels, n in _samples(text, "gpupilot_adapter_request_duration_seconds_count").items():
                assert buckets[f'{labels},le="+Inf"'] == n
    finally:
        stop.set()
        writer.join()


@pytest.mark.parametrize(
    "raw",
    [
        "labelSelector=app%3Dllm-inference",
        "labelSelector=app+in+%28a%2Cb%29&metricLabelSelector=",
        "a=1&a=2&b=&c",
        "labelSelector=tier%3Dgpu%2C%21canary",
        "",
        "x=%zz&y=%E2%82%AC",
    ],
)
def test_query_strings_parse_as_aiohttp_parses_them(raw: str) -> None:
    expected = {k: v for k, v in yarl.URL(f"/p?{raw}").query.items()}
    assert server._parse_query(raw) == expected
    assert server._query(raw) == expected
    assert server._query(raw) is server._query(raw)  # memoised: the HPA repeats itself
    with pytest.raises(TypeError):  # and shared, so read-only
        server._query(raw)["labelSelector"] = "app=other"  # type: ignore[index]


def test_serving_context_refuses_renegotiation(tmp_path: Path) -> None:
    cert, key = self_signed_pair(tmp_path)
    ctx = server_context(cert_file=cert, key_file=key, client_ca_pems=[])
    assert ctx.options & ssl.OP_NO_RENEGOTIATION
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2


def test_a_client_that_stops_reading_gets_cut_at_the_write_deadline() -> None:
    """The write deadline is armed only when the transport's buffer is over its high-water mark (the
    protocol is paused): then a client that never reads releases the handler after
    ``write_timeout``, and the connection is closed."""

    async def scenario() -> float:
        loop = asyncio.get_running_loop()

        async def unused(request: web.BaseRequest) -> web.StreamResponse:
            return web.Response()

        proto = server._Protocol(web.Server(unused), loop=loop)
        proto.write_timeout = 0.2
        proto.connection_made(_PausedTransport())
        proto.pause_writing()  # the client stopped reading: nothing will resume writing
        started = loop.time()
        with pytest.raises(TimeoutError):  # the outer 5 s bound is for a deadline that never fires
            await asyncio.wait_for(proto._drain_helper(), 5.0)
        waited = loop.time() - started
        proto.resume_writing()
        await proto._drain_helper()  # not paused: returns at once, no deadline involved
        return waited

    waited = asyncio.run(scenario())
    assert 0.15 <= waited < 2.0


class _PausedTransport(asyncio.Transport):
    def get_extra_info(self, name: str, default: object = None) -> object:
        return default

    def is_closing(self) -> bool:
        return False
