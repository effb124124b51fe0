"""The adapter's only door to Prometheus (or anything speaking its HTTP API: Thanos, Mimir,
VictoriaMetrics).

Instant queries go as form-encoded POST bodies, so a query's length never meets a URL limit (the
anchor's GET with ``pod=~"a|b|…"`` gets HTTP 414 behind proxies and VictoriaMetrics' 16 KiB limit).
Metric names for discovery come from ``/api/v1/label/__name__/values`` through prometheus-api-client
(names only — never the huge ``/api/v1/series`` answer). Every failure becomes
``PrometheusUnavailable`` carrying the cause, which the API answers as 503.
"""

from __future__ import annotations

import functools
import math
import re
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import requests
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from prometheus_client import Counter, Histogram

from adapter.errors import PrometheusUnavailable


@dataclass(frozen=True)
class Sample:
    """One element of an instant vector: its labels, value and evaluation time (Unix seconds)."""

    labels: Mapping[str, str]
    value: float
    timestamp: float


@dataclass(frozen=True)
class RangeSeries:
    """One series of a range query: labels and (Unix time, value) points in time order."""

    labels: Mapping[str, str]
    points: list[tuple[float, float]]


class PrometheusClient:
    """Thread-safe enough for the server: one ``requests.Session`` with a connection pool."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 5.0,
        bearer_token: str = "",
        ca_file: str = "",
        registry_metrics: PrometheusMetrics | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._session = requests.Session()
        # no per-request .netrc / proxy-environment lookups (they cost ~5 ms a request)
        self._session.trust_env = False
        adapter = requests.adapters.HTTPAdapter(pool_connections=4, pool_maxsize=32)
        self._session.mount("http://", adapter)
        self._session.mount("https://", adapter)
        if ca_file:
            self._session.verify = ca_file
        headers = {"Authorization": f"Bearer {bearer_token}"} if bearer_token else None
        self._api = PrometheusConnect(url=self.url, headers=headers, session=self._session, timeout=timeout)
        # PrometheusConnect mounts a retrying adapter on our URL; a failing Prometheus must answer
        # 503 within one timeout, and the HPA retries on its next sync anyway.
        self._session.mount(self.url, adapter)
        self._headers = headers or {}
        self._metrics = registry_metrics

    def query(self, promql: str, *, at: float | None = None, purpose: str = "value") -> list[Sample]:
        """Evaluate an instant query (POST). NaN and infinite values are dropped, not turned into 0."""
        form = {"query": promql}
        if at is not None:
            form["time"] = f"{at:.3f}"
        body = _encode(tuple(form.items()))
        headers = {**self._headers, "Content-Type": "application/x-www-form-urlencoded"}
        start = time.perf_counter()
        try:
            resp = self._session.post(
                f"{self.url}/api/v1/query", data=body, headers=headers, timeout=self.timeout
            )
        except requests.RequestException as exc:
            self._count_error(purpose)
            raise PrometheusUnavailable(f"Prometheus at {self.url} unreachable: {_short(exc)}") from exc
        finally:
            if self._metrics is not None:
                self._metrics.query_seconds.labels(purpose).observe(time.perf_counter() - start)
        answer = _json(resp)
        if resp.status_code != 200 or answer.get("status") != "success":
            self._count_error(purpose)
            detail = answer.get("error") or resp.text[:200].strip() or resp.reason
            raise PrometheusUnavailable(
                f"Prometheus at {self.url} answered HTTP {resp.status_code} to the query: {detail}"
            )
        return _samples(answer.get("data", {}))

    def query_range(
        self, promql: str, *, start: float, end: float, step: float, purpose: str = "history"
    ) -> list[RangeSeries]:
        """Evaluate a range query (POST); ranges longer than 10,000 steps go in several requests
        (Prometheus refuses more than 11,000 points per series). NaN/inf points are dropped."""
        merged: dict[tuple[tuple[str, str], ...], RangeSeries] = {}
        chunk = step * 10_000
        t = start
        while t <= end:
            stop = min(end, t + chunk - step)
            form = (("query", promql), ("start", f"{t:.3f}"), ("end", f"{stop:.3f}"), ("step", f"{step:g}"))
            headers = {**self._headers, "Content-Type": "application/x-www-form-urlencoded"}
            try:
                resp = self._session.post(
                    f"{self.url}/api/v1/query_range",
                    data=_encode(form),
                    headers=headers,
                    timeout=self.timeout,
                )
            except requests.RequestException as exc:
                self._count_error(purpose)
                raise PrometheusUnavailable(f"Prometheus at {self.url} unreachable: {_short(exc)}") from exc
            answer = _json(resp)
            if resp.status_code != 200 or answer.get("status") != "success":
                self._count_error(purpose)
                detail = answer.get("error") or resp.text[:200].strip() or resp.reason
                raise PrometheusUnavailable(
                    f"Prometheus at {self.url} answered HTTP {resp.status_code} to a range query: {detail}"
                )
            for item in (answer.get("data") or {}).get("result") or []:
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
        try:
            names = self._api.all_metrics()
        except (requests.RequestException, PrometheusApiClientException, ValueError) as exc:
            self._count_error("discovery")
            raise PrometheusUnavailable(
                f"Prometheus at {self.url}: listing metric names failed: {_short(exc)}"
            ) from exc
        return {str(n) for n in names}

    def ready(self) -> bool:
        try:
            resp = self._session.get(f"{self.url}/-/ready", headers=self._headers, timeout=self.timeout)
        except requests.RequestException:
            return False
        return resp.status_code == 200

    def close(self) -> None:
        self._session.close()

    def _count_error(self, purpose: str) -> None:
        if self._metrics is not None:
            self._metrics.errors.labels(purpose).inc()


class PrometheusMetrics:
    """The adapter's own series about its Prometheus traffic."""

    def __init__(self, registry: Any) -> None:
        self.query_seconds = Histogram(
            "gpupilot_adapter_prometheus_query_duration_seconds",
            "Time taken by Prometheus queries, by purpose (value, pods, discovery).",
            ["purpose"],
            buckets=(0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
            registry=registry,
        )
        self.errors = Counter(
            "gpupilot_adapter_prometheus_errors_total",
            "Prometheus requests that failed (unreachable, non-200 or error status), by purpose.",
            ["purpose"],
            registry=registry,
        )


@functools.lru_cache(maxsize=256)
def _encode(form: tuple[tuple[str, str], ...]) -> str:
    """Form-encode a query; repeated HPA queries (with large pod sets) are encoded once."""
    return urllib.parse.urlencode(form)


def _short(exc: BaseException) -> str:
    """The root cause in a few words: ``[Errno 111] Connection refused``, not urllib3's whole chain."""
    if isinstance(exc, requests.Timeout):
        return "timed out"
    text = str(exc).strip()
    errno = re.search(r"\[Errno -?\d+\] [^'\")]+", text)
    if errno:
        return errno.group(0).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    return first[:300]


def _json(resp: requests.Response) -> dict[str, Any]:
    try:
        data = orjson.loads(resp.content)
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
