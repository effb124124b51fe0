"""The rightsizer's one door to Prometheus (or anything speaking its HTTP API: Thanos, Mimir, VM).

A small generic API returning plain Python data — :meth:`PrometheusClient.instant` and
:meth:`PrometheusClient.range` — used by the analysis and the weekly report alike. Errors::

    PrometheusError                 base class, one-line messages
    ├── PrometheusUnavailable       could not connect / timed out / 5xx (temporary: retry later)
    └── PrometheusQueryError        the server rejected the query (permanent: fix the query/URL)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import requests

from rightsizer.errors import RightsizerError


class PrometheusError(RightsizerError, RuntimeError):
    """Something went wrong talking to Prometheus; ``str()`` is one line naming the URL."""


class PrometheusUnavailable(PrometheusError):
    """Prometheus could not be reached or answered 5xx; temporary."""


class PrometheusQueryError(PrometheusError):
    """Prometheus rejected the query (bad PromQL, too many samples, wrong path); permanent."""


@dataclass(frozen=True)
class Sample:
    labels: dict[str, str]
    value: float
    timestamp: float


@dataclass(frozen=True)
class Series:
    labels: dict[str, str]
    points: list[tuple[float, float]]


def _as_time(at: float | datetime | None) -> float | None:
    if at is None:
        return None
    if isinstance(at, datetime):
        if at.tzinfo is None:
            at = at.replace(tzinfo=UTC)
        return at.timestamp()
    return float(at)


def _value(text: str) -> float:
    return float(text) if text not in ("NaN", "+Inf", "-Inf") else float(text.replace("+", ""))


class PrometheusClient:
    """Blocking client over ``requests``; one instance per base URL, reused for every query."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 60.0,
        headers: dict[str, str] | None = None,
        session: requests.Session | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._session = session or requests.Session()
        if headers:
            self._session.headers.update(headers)
        self.queries = 0
        """Queries sent so far (the analysis reports it; tests check it stays O(slices))."""

    def close(self) -> None:
        self._session.close()

    def __enter__(self) -> PrometheusClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _get(self, path: str, params: dict[str, str]) -> Any:
        self.queries += 1
        endpoint = f"{self.url}{path}"
        try:
            resp = self._session.post(endpoint, data=params, timeout=self.timeout)
        except requests.Timeout as exc:
            raise PrometheusUnavailable(
                f"Prometheus at {self.url} did not answer within {self.timeout:.0f}s"
            ) from exc
        except requests.RequestException as exc:
            raise PrometheusUnavailable(
                f"cannot reach Prometheus at {self.url} ({type(exc).__name__}); is it running? check --prometheus-url"
            ) from exc
        try:
            body = resp.json()
        except ValueError:
            body = None
        if resp.status_code >= 500 and not (isinstance(body, dict) and body.get("errorType") == "execution"):
            raise PrometheusUnavailable(
                f"Prometheus at {self.url} answered HTTP {resp.status_code} for {path}"
            )
        if not isinstance(body, dict):
            raise PrometheusQueryError(
                f"{endpoint} answered HTTP {resp.status_code} without a Prometheus API body; is the URL right?"
            )
        if body.get("status") != "success":
            err = str(body.get("error", "unknown error")).splitlines()[0]
            raise PrometheusQueryError(f"Prometheus at {self.url} rejected a query: {err}")
        return body.get("data")

    def instant(self, query: str, at: float | datetime | None = None) -> list[Sample]:
        """Evaluate ``query`` at ``at`` (Unix seconds or datetime; default now). Vectors and scalars."""
        params = {"query": query}
        t = _as_time(at)
        if t is not None:
            params["time"] = f"{t:.3f}"
        data = self._get("/api/v1/query", params)
        kind = data.get("resultType")
        if kind == "scalar":
            ts, val = data["result"]
            return [Sample({}, _value(val), float(ts))]
        if kind != "vector":
            raise PrometheusQueryError(f"expected a vector from {query!r:.60}, got {kind}")
        return [
            Sample(dict(r["metric"]), _value(r["value"][1]), float(r["value"][0]))
            for r in data["result"]
            if not math.isnan(_value(r["value"][1]))
        ]

    def range(self, query: str, start: float | datetime, end: float | datetime, step: float) -> list[Series]:
        """``query_range`` from ``start`` to ``end`` every ``step`` seconds."""
        params = {
            "query": query,
            "start": f"{_as_time(start):.3f}",
            "end": f"{_as_time(end):.3f}",
            "step": f"{step:.3f}",  # exact to the millisecond Prometheus works in (never ':g' rounding)
        }
        data = self._get("/api/v1/query_range", params)
        return [
            Series(dict(r["metric"]), [(float(t), _value(v)) for t, v in r["values"]])
            for r in data.get("result", [])
        ]

    def has_data(self, selector: str, *, start: float, end: float) -> bool:
        """Whether any series of ``selector`` has a sample in ``(start, end]``."""
        span = max(1, int(end - start))
        return bool(self.instant(f"count(count_over_time({selector}[{span}s]))", end))
