"""The adapter's only door to Prometheus (or anything speaking its HTTP API: Thanos, Mimir,
VictoriaMetrics).

Every request has **one deadline** (``timeout``: connect, send, headers and body together):
aiohttp's total timeout, not a per-read timeout, so a server that trickles one byte a second cannot
hold a request past it. Requests run on a private event loop in one thread; the methods here are
synchronous and thread-safe (the refresher, the pod source and ``explain-hpa`` call them from
threads).

Instant queries go as form-encoded POST bodies, so a query's length never meets a URL limit (the
anchor's GET with ``pod=~"a|b|…"`` gets HTTP 414 behind proxies and VictoriaMetrics' 16 KiB limit).
Metric names for discovery come from ``/api/v1/label/__name__/values`` (names only — never the
huge ``/api/v1/series`` answer). Every failure becomes ``PrometheusUnavailable`` carrying the cause,
which the API answers as 503.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import math
import re
import ssl
import threading
import time
import urllib.parse
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

import aiohttp
import orjson
from prometheus_client import Counter, Histogram

from adapter.errors import ConfigError, PrometheusDenied, PrometheusUnavailable
from gpupilot_common import credentials, promauth, timefmt
from gpupilot_common.urls import split_userinfo

T = TypeVar("T")


class Sample(NamedTuple):
    """One element of an instant vector: its labels, value and evaluation time (Unix seconds). A
    named tuple: an answer holds one per series (5,000 for a namespace of pods), built in a third
    of a frozen dataclass's time."""

    labels: Mapping[str, str]
    value: float
    timestamp: float


@dataclass(frozen=True)
class RangeSeries:
    """One series of a range query: labels and (Unix time, value) points in time order."""

    labels: Mapping[str, str]
    points: list[tuple[float, float]]


@dataclass(frozen=True)
class _Answer:
    status: int
    reason: str
    body: bytes


class PrometheusClient:
    """Thread-safe: calls from any thread run on the client's own event loop, one connection pool."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 5.0,
        auth: promauth.PrometheusAuth | None = None,
        registry_metrics: PrometheusMetrics | None = None,
        max_connections: int = 32,
    ) -> None:
        if not math.isfinite(timeout) or timeout <= 0:
            raise ValueError(f"Prometheus timeout {timeout!r}: must be a finite number of seconds > 0")
        # user:password@ in the URL becomes an Authorization header; the URL every message shows
        # (503 bodies, logs, explain-hpa) has none. A path prefix (/prometheus) stays in it.
        self.url, basic_auth = split_userinfo(url.rstrip("/"))
        self.timeout = timeout
        try:
            # reads the token/password files and the TLS files now: a bad one stops the start
            self._credentials = credentials.Credentials(
                auth or promauth.PrometheusAuth(), userinfo=basic_auth
            )
        except promauth.CredentialError as exc:
            raise ConfigError(str(exc)) from None
        self._ssl: ssl.SSLContext | bool = self._credentials.ssl_context or True
        self._metrics = registry_metrics
        self._max_connections = max_connections
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="prometheus-io", daemon=True)
        self._thread.start()
        self._session: aiohttp.ClientSession | None = None
        self._closed = False

    # -- the event loop side --------------------------------------------------------------------
    async def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._max_connections, ssl=self._ssl),
                trust_env=False,  # no proxy-environment lookups: the URL given is the server
                auto_decompress=True,
            )
        return self._session

    async def _fetch(self, method: str, path: str, *, data: str | None = None) -> _Answer:
        session = await self._client()
        # per request: a rotated token file is picked up at the next request
        headers = self._credentials.headers()
        if data is not None:
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        async with asyncio.timeout(self.timeout):  # one deadline: connect + send + headers + body
            async with session.request(method, self.url + path, data=data, headers=headers) as resp:
                return _Answer(resp.status, resp.reason or "", await resp.read())

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._closed:
            coro.close()
            raise PrometheusUnavailable(f"Prometheus client for {self.url} is closed")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            # the coroutine enforces the deadline; the margin covers a loop busy with other calls
            return future.result(self.timeout + 1.0)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError from None

    def _call(self, method: str, path: str, *, data: str | None, purpose: str) -> _Answer:
        start = time.perf_counter()
        try:
            return self._run(self._fetch(method, path, data=data))
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as exc:
            self._count_error(purpose)
            raise PrometheusUnavailable(
                self._credentials.scrub(f"Prometheus at {self.url} unreachable: {_short(exc, self)}")
            ) from exc
        finally:
            if self._metrics is not None:
                self._metrics.query_seconds.labels(purpose).observe(time.perf_counter() - start)

    # -- the API ---------------------------------------------------------------------------------
    def query(self, promql: str, *, at: float | None = None, purpose: str = "value") -> list[Sample]:
        """Evaluate an instant query (POST). NaN and infinite values are dropped, not turned into 0."""
        form = {"query": promql}
        if at is not None:
            form["time"] = f"{at:.3f}"
        answer = self._call("POST", "/api/v1/query", data=_encode(tuple(form.items())), purpose=purpose)
        data = _json(answer.body)
        if answer.status != 200 or data.get("status") != "success":
            self._count_error(purpose)
            raise self._refused(answer, data, "to the query")
        try:
            return _samples(data.get("data", {}))
        except (AttributeError, KeyError, TypeError, ValueError, IndexError) as exc:
            # JSON, but not the API's shape (a sample value of "abc"): 503 with one line
            detail = str(exc).splitlines()[0][:80] if str(exc) else type(exc).__name__
            raise PrometheusUnavailable(
                f"Prometheus at {self.url} answered with a malformed result ({detail})"
            ) from None

    def query_range(
        self, promql: str, *, start: float, end: float, step: float, purpose: str = "history"
    ) -> list[RangeSeries]:
        """Evaluate a range query (POST); ranges longer than 10,000 steps go in several requests
        (Prometheus refuses more than 11,000 points per series), each with its own deadline.
        NaN/inf points are dropped."""
        merged: dict[tuple[tuple[str, str], ...], RangeSeries] = {}
        chunk = step * 10_000
        t = start
        while t <= end:
            stop = min(end, t + chunk - step)
            form = (("query", promql), ("start", f"{t:.3f}"), ("end", f"{stop:.3f}"), ("step", f"{step:g}"))
            answer = self._call("POST", "/api/v1/query_range", data=_encode(form), purpose=purpose)
            data = _json(answer.body)
            if answer.status != 200 or data.get("status") != "success":
                self._count_error(purpose)
                raise self._refused(answer, data, "to a range query")
            for item in (data.get("data") or {}).get("result") or []:
                labels = item.get("metric", {})
                key = tuple(sorted(labels.items()))
                series = merged.setdefault(key, RangeSeries(labels, []))
                for ts, raw in item.get("values") or []:
                    value = float(raw)
                    if math.isfinite(value):
                        series.points.append((float(ts), value))
            t = stop + step
        return list(merged.values())

    def metric_names(self) -> set[str]:
        """Every metric name Prometheus holds (``/api/v1/label/__name__/values``)."""
        answer = self._call("GET", "/api/v1/label/__name__/values", data=None, purpose="discovery")
        data = _json(answer.body)
        names = data.get("data")
        if answer.status != 200 or data.get("status") != "success" or not isinstance(names, list):
            self._count_error("discovery")
            raise self._refused(answer, data, "listing metric names")
        return {str(n) for n in names}

    def scrape_interval(self) -> float | None:
        """Prometheus' ``global.scrape_interval`` in seconds (``/api/v1/status/config``); None when
        the server does not publish it (Thanos, Mimir and VictoriaMetrics may not) or is down."""
        try:
            answer = self._call("GET", "/api/v1/status/config", data=None, purpose="discovery")
        except PrometheusUnavailable:
            return None
        data = _json(answer.body).get("data")
        text = data.get("yaml") if isinstance(data, dict) else None
        if answer.status != 200 or not isinstance(text, str):
            return None
        match = re.search(r"^global:\n(?:[ \t]+.*\n)*?[ \t]+scrape_interval:[ \t]*(\S+)", text, re.MULTILINE)
        return _duration_seconds(match.group(1)) if match else None

    def check_access(self) -> None:
        """One small query; raises :class:`PrometheusDenied` when the backend refuses the tenant or
        credentials (other failures are left to the queries that follow, which report them)."""
        try:
            self.query("vector(1)", purpose="check")
        except PrometheusDenied:
            raise
        except PrometheusUnavailable:
            pass

    def ready(self) -> bool:
        try:
            return self._call("GET", "/-/ready", data=None, purpose="ready").status == 200
        except PrometheusUnavailable:
            return False

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True

        async def shutdown() -> None:
            if self._session is not None:
                await self._session.close()

        with_timeout = asyncio.run_coroutine_threadsafe(shutdown(), self._loop)
        with contextlib.suppress(concurrent.futures.TimeoutError, OSError):
            with_timeout.result(2.0)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(2.0)
        if not self._thread.is_alive():
            self._loop.close()

    def _refused(self, answer: _Answer, data: Mapping[str, Any], what: str) -> PrometheusUnavailable:
        """One line for a non-200 (or error-status) answer; 401/403 say which flags to check."""
        detail = data.get("error") or answer.body[:200].decode(errors="replace").strip() or answer.reason
        hint = promauth.status_hint(answer.status)
        text = (
            f"Prometheus at {self.url} answered HTTP {answer.status} {what}: {' '.join(str(detail).split())}"
        )
        kind = PrometheusDenied if hint else PrometheusUnavailable
        return kind(self._credentials.scrub(text + (f"; {hint}" if hint else "")))

    def _count_error(self, purpose: str) -> None:
        if self._metrics is not None:
            self._metrics.errors.labels(purpose).inc()


class PrometheusMetrics:
    """The adapter's own series about its Prometheus traffic."""

    def __init__(self, registry: Any) -> None:
        self.query_seconds = Histogram(
            "gpupilot_adapter_prometheus_query_duration_seconds",
            "Time taken by Prometheus requests, by purpose (value, pods, discovery, ready); "
            "the _count is the number of requests sent.",
            ["purpose"],
            buckets=(0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
            registry=registry,
        )
        self.errors = Counter(
            "gpupilot_adapter_prometheus_errors_total",
            "Prometheus requests that failed (unreachable, past the deadline, non-200 or error status), "
            "by purpose.",
            ["purpose"],
            registry=registry,
        )


@functools.lru_cache(maxsize=256)
def _encode(form: tuple[tuple[str, str], ...]) -> str:
    """Form-encode a query; repeated queries are encoded once."""
    return urllib.parse.urlencode(form)


def _short(exc: BaseException, client: PrometheusClient) -> str:
    """The root cause in a few words: ``Connection refused``, not the whole exception chain."""
    if isinstance(exc, TimeoutError):
        return f"no complete answer within {client.timeout:g}s (--prometheus-timeout)"
    if isinstance(exc, aiohttp.ClientSSLError) or promauth.is_tls_failure(exc):
        return promauth.tls_failure(exc)
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return promauth.disconnected(client.url)
    if isinstance(exc, aiohttp.ClientConnectorError):
        return exc.os_error.strerror or str(exc.os_error) or type(exc).__name__
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    return first[:300]


def _duration_seconds(text: str) -> float | None:
    """A Prometheus duration (``15s``, ``1m30s``) in seconds; None when malformed or not > 0."""
    try:
        return timefmt.parse_duration(text)
    except ValueError:
        return None


def _json(body: bytes) -> dict[str, Any]:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return {}
    return data if isinstance(data, dict) else {}


def _samples(data: Mapping[str, Any]) -> list[Sample]:
    kind = data.get("resultType")
    result: Sequence[Any] = data.get("result") or []
    if kind == "scalar":
        ts, raw = result
        value = float(raw)
        return [Sample({}, value, float(ts))] if math.isfinite(value) else []
    if kind != "vector":
        raise PrometheusUnavailable(
            f"Prometheus returned a {kind!r} result; the query must give an instant vector"
        )
    out = []
    for item in result:
        ts, raw = item["value"]
        value = float(raw)
        if math.isfinite(value):
            out.append(Sample(item.get("metric", {}), value, float(ts)))
    return out
