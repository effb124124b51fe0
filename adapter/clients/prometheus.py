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
huge ``/api/v1/series`` answer). Answers are read in 64 KiB chunks by the shared reader
(:mod:`gpupilot_common.promanswer`), which stops at ``--max-answer-series``/``--max-answer-bytes``
and names each kind of failure (connection refused, timed out after N s, Prometheus' own error text,
truncated JSON, over a limit); each becomes ``PrometheusUnavailable`` (``PrometheusDenied`` for
401/403), which the API answers as 503. Values come back as Prometheus sent them, NaN and ±Inf
included: :mod:`adapter.provider.valuecheck` decides what may be served.

Memory: every answer being read or parsed is charged to the process's one
:class:`~adapter.clients.membudget.MemoryBudget` (``--memory-budget``), so answers in flight
together stay under it; identical instant queries in flight are sent once and every caller gets
that one answer. A refused or failed answer leaves nothing behind: its bytes are dropped, and the
error raised carries no chained exception or traceback that could reference them (an error is
kept by the refresher until the next refresh).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import functools
import math
import os
import re
import ssl
import threading
import time
import urllib.parse
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp
from prometheus_client import Counter, Histogram

from adapter.clients import inflight, membudget
from adapter.errors import ConfigError, PrometheusDenied, PrometheusUnavailable
from gpupilot_common import credentials, promanswer, promauth, timefmt
from gpupilot_common.urls import split_userinfo

T = TypeVar("T")


Sample = promanswer.Sample
RangeSeries = promanswer.Series

DEFAULT_LIMITS = promanswer.AnswerLimits()
"""Per answer: 100,000 series and 64 MiB (``--max-answer-series``, ``--max-answer-bytes``); a
namespace of 5,000 pods answers in about 1 MB."""

CHUNK = 1 << 16


@dataclass(frozen=True)
class _Answer:
    status: int
    reason: str
    body: promanswer.AnswerBody

    def data(self, path: str) -> dict[str, Any]:
        return promanswer.decode(self.status, self.reason, self.body, path=path)


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
        limits: promanswer.AnswerLimits = DEFAULT_LIMITS,
        budget: membudget.MemoryBudget | None = None,
    ) -> None:
        if not math.isfinite(timeout) or timeout <= 0:
            raise ValueError(f"Prometheus timeout {timeout!r}: must be a finite number of seconds > 0")
        # user:password@ in the URL becomes an Authorization header; the URL every message shows
        # (503 bodies, logs, explain-hpa) has none. A path prefix (/prometheus) stays in it.
        self.url, basic_auth = split_userinfo(url.rstrip("/"))
        self.timeout = timeout
        self.limits = limits
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
        self.budget = budget
        """None: answers are bounded one by one only (the offline commands)."""
        self._inflight: inflight.InFlight[list[Sample]] = inflight.InFlight(copy=_copied)

    # -- the event loop side --------------------------------------------------------------------
    async def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._max_connections, ssl=self._ssl),
                trust_env=False,  # no proxy-environment lookups: the URL given is the server
                auto_decompress=True,
            )
        return self._session

    async def _fetch(
        self, method: str, path: str, *, data: str | None, query: str, lease: membudget.Lease | None
    ) -> _Answer:
        session = await self._client()
        # per request: a rotated token file is picked up at the next request
        headers = self._credentials.headers()
        if data is not None:
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        body = promanswer.AnswerBody(url=self.url, query=query, limits=self.limits)
        try:
            async with asyncio.timeout(self.timeout):  # one deadline: connect + send + headers + body
                async with session.request(method, self.url + path, data=data, headers=headers) as resp:
                    # read chunk by chunk: an answer over the limits or the budget stops here, the
                    # connection closed
                    try:
                        async for chunk in resp.content.iter_chunked(CHUNK):
                            body.feed(chunk)
                            if lease is not None:  # what the answer read so far costs once parsed
                                cost = membudget.parse_cost(body.size, body.series, body.labels)
                                await lease.charge_to(cost, read=body.size)
                    except RuntimeError:
                        # aiohttp's stream raises a bare RuntimeError("Connection closed.") when the
                        # connection goes away mid-answer: a transport failure like any other
                        raise aiohttp.ClientPayloadError("the connection closed during the answer") from None
                    return _Answer(resp.status, resp.reason or "", body)
        except BaseException:
            body.discard()  # the traceback keeps this frame: it must not keep the bytes
            raise

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

    def _call(
        self,
        method: str,
        path: str,
        *,
        data: str | None,
        purpose: str,
        query: str = "",
        lease: membudget.Lease | None = None,
    ) -> _Answer:
        # Every failure is raised after its ``except`` block, as a new error: one raised inside it
        # would chain the caught exception (``__context__``), whose traceback holds the frames that
        # read the answer, and the refresher keeps its last error.
        start = time.perf_counter()
        failure: PrometheusUnavailable
        try:
            return self._run(self._fetch(method, path, data=data, query=query or path, lease=lease))
        except promanswer.PrometheusFailure as exc:
            failure = self._ours(exc)
        except membudget.BudgetExceeded as exc:
            failure = PrometheusUnavailable(f"Prometheus at {self.url}: {exc}")
        except TimeoutError:
            failure = self._ours(promanswer.timed_out(self.url, self.timeout, flag="--prometheus-timeout"))
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            failure = self._ours(promanswer.unreachable(self.url, _short(exc, self), flag="--prometheus-url"))
        finally:
            if self._metrics is not None:
                self._metrics.query_seconds.labels(purpose).observe(time.perf_counter() - start)
        self._count_error(purpose)
        raise failure

    def _decoded(self, answer: _Answer, path: str, purpose: str) -> dict[str, Any]:
        failure: PrometheusUnavailable
        try:
            return answer.data(path)
        except promanswer.PrometheusFailure as exc:
            failure = self._ours(exc)
        self._count_error(purpose)
        raise failure

    def _lease(self, query: str) -> membudget.Lease | None:
        return None if self.budget is None else self.budget.lease(repr(_shown(query)))

    def _ours(self, exc: promanswer.PrometheusFailure) -> PrometheusUnavailable:
        """The shared reader's failure as the adapter's (503 to the HPA; 401/403 stop the tools)."""
        kind = PrometheusDenied if isinstance(exc, promanswer.PrometheusDenied) else PrometheusUnavailable
        return kind(self._credentials.scrub(str(exc)))

    # -- the API ---------------------------------------------------------------------------------
    def query(self, promql: str, *, at: float | None = None, purpose: str = "value") -> list[Sample]:
        """Evaluate an instant query (POST). Values as Prometheus gave them, NaN and ±Inf included:
        :mod:`adapter.provider.valuecheck` decides at the door what may be served. The same query
        asked again while it is in flight (``at`` not given) waits for that answer instead of
        sending another; each caller gets its own list."""
        failure: PrometheusUnavailable
        try:
            if at is not None:
                return self._query(promql, at=at, purpose=purpose)
            shared = self._inflight.run(
                promql,
                lambda: self._query(promql, at=None, purpose=purpose),
                wait=self.timeout * 2 + 1.0,
                late=lambda: self._ours(
                    promanswer.timed_out(self.url, self.timeout, flag="--prometheus-timeout")
                ),
            )
            return list(shared)
        except PrometheusUnavailable as exc:
            failure = exc.with_traceback(None)  # the frames below held the answer
        raise failure

    @property
    def coalesced(self) -> int:
        """Instant queries answered by another caller's request in flight (tests, the bench)."""
        return self._inflight.joined

    def _query(self, promql: str, *, at: float | None, purpose: str) -> list[Sample]:
        form = {"query": promql}
        if at is not None:
            form["time"] = f"{at:.3f}"
        path = "/api/v1/query"
        lease = self._lease(promql)
        answer: _Answer | None = None
        failure: PrometheusUnavailable
        try:
            answer = self._call(
                "POST", path, data=_encode(tuple(form.items())), purpose=purpose, query=promql, lease=lease
            )
            data = self._decoded(answer, path, purpose)
            try:
                samples = promanswer.vector(data, answer.body)
            except promanswer.PrometheusFailure as exc:
                failure = self._ours(exc)
            else:
                if lease is not None:  # the refresher holds what it keeps (membudget.take_parsed)
                    body = answer.body
                    membudget.note_parsed(membudget.held_cost(body.size, body.series, body.labels))
                return samples
            del data
        finally:
            if answer is not None:
                answer.body.discard()
            if lease is not None:
                lease.release()
        self._count_error(purpose)
        raise failure

    def query_range(
        self,
        promql: str,
        *,
        start: float,
        end: float,
        step: float,
        purpose: str = "history",
        non_finite: list[tuple[Mapping[str, str], float, float]] | None = None,
    ) -> list[RangeSeries]:
        """Evaluate a range query (POST); ranges longer than 10,000 steps go in several requests
        (Prometheus refuses more than 11,000 points per series), each with its own deadline.
        NaN/inf points are dropped; ``non_finite`` collects them (labels, time, value) when given."""
        merged: dict[tuple[tuple[str, str], ...], RangeSeries] = {}
        chunk = step * 10_000
        t = start
        while t <= end:
            stop = min(end, t + chunk - step)
            form = (("query", promql), ("start", f"{t:.3f}"), ("end", f"{stop:.3f}"), ("step", f"{step:g}"))
            path = "/api/v1/query_range"
            lease = self._lease(promql)
            failure: PrometheusUnavailable | None = None
            try:
                answer = self._call(
                    "POST", path, data=_encode(form), purpose=purpose, query=promql, lease=lease
                )
                data = self._decoded(answer, path, purpose)
                try:
                    got = promanswer.matrix(data, answer.body)
                except promanswer.PrometheusFailure as exc:
                    failure = self._ours(exc)
                del data
                answer.body.discard()
            finally:
                if lease is not None:
                    lease.release()
            if failure is not None:
                self._count_error(purpose)
                raise failure
            for item in got:
                key = tuple(sorted(item.labels.items()))
                series = merged.setdefault(key, RangeSeries(item.labels, []))
                before = len(series.points)
                series.points.extend(p for p in item.points if math.isfinite(p[1]))
                if non_finite is not None and len(series.points) - before < len(item.points):
                    non_finite.extend((item.labels, t, v) for t, v in item.points if not math.isfinite(v))
            t = stop + step
        return list(merged.values())

    def metric_names(self) -> set[str]:
        """Every metric name Prometheus holds (``/api/v1/label/__name__/values``)."""
        path = "/api/v1/label/__name__/values"
        lease = self._lease("metric names")
        try:
            answer = self._call(
                "GET", path, data=None, purpose="discovery", query="metric names", lease=lease
            )
            try:
                return set(promanswer.names(self._decoded(answer, path, "discovery")))
            finally:
                answer.body.discard()
        finally:
            if lease is not None:
                lease.release()

    def scrape_interval(self) -> float | None:
        """Prometheus' ``global.scrape_interval`` in seconds (``/api/v1/status/config``); None when
        the server does not publish it (Thanos, Mimir and VictoriaMetrics may not) or is down."""
        path = "/api/v1/status/config"
        try:
            data = self._call("GET", path, data=None, purpose="discovery").data(path)
        except (PrometheusUnavailable, promanswer.PrometheusFailure):
            return None
        text = data.get("yaml")
        if not isinstance(text, str):
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


def _copied(exc: BaseException) -> BaseException | None:
    """A waiter's own copy of the one answer's error."""
    return type(exc)(str(exc)) if isinstance(exc, PrometheusUnavailable) else None


def _shown(query: str) -> str:
    one = " ".join(query.split())
    return one if len(one) <= 80 else one[:77] + "..."


def _short(exc: BaseException, client: PrometheusClient) -> str:
    """The root cause in a few words: ``connection refused``, not the whole exception chain."""
    if isinstance(exc, aiohttp.ClientSSLError) or promauth.is_tls_failure(exc):
        return promauth.tls_failure(exc)
    if isinstance(exc, aiohttp.ServerDisconnectedError) or (
        isinstance(exc, OSError) and exc.errno == errno.ECONNRESET
    ):  # a reset is the other way a TLS 1.3 server's refusal of the client certificate arrives
        return promauth.disconnected(client.url)
    if isinstance(exc, aiohttp.ClientConnectorError):
        if exc.os_error.errno:  # "connection refused", not "Connect call failed ('127.0.0.1', 9)"
            return os.strerror(exc.os_error.errno).lower()
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
