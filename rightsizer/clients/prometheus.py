"""The rightsizer's one door to Prometheus (or anything speaking its HTTP API: Thanos, Mimir, VM).

A small generic API returning plain Python data — :meth:`PrometheusClient.instant` and
:meth:`PrometheusClient.range` — used by the analysis and the weekly report alike. Errors::

    PrometheusError                 base class, one-line messages
    ├── PrometheusUnavailable       could not connect / timed out / 5xx (temporary: retry later)
    └── PrometheusQueryError        the server rejected the query (permanent: fix the query/URL)
        └── PrometheusDenied        401/403: the tenant or credentials are wrong
    PrometheusAuthError             (an InputError) a tenant, credential or TLS flag or file is wrong

Tenant, basic auth, bearer token file (re-read when it changes), CA bundle and client certificate:
:mod:`gpupilot_common.promauth`, the same settings as the adapter's.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import requests
from prometheus_api_client import PrometheusConnect
from urllib3.util.retry import Retry

from gpupilot_common import credentials, promauth
from gpupilot_common.urls import split_userinfo
from rightsizer.errors import InputError, RightsizerError


class PrometheusError(RightsizerError, RuntimeError):
    """Something went wrong talking to Prometheus; ``str()`` is one line naming the URL."""


class PrometheusUnavailable(PrometheusError):
    """Prometheus could not be reached or answered 5xx; temporary."""


class PrometheusQueryError(PrometheusError):
    """Prometheus rejected the query (bad PromQL, too many samples, wrong path); permanent."""


class PrometheusDenied(PrometheusQueryError):
    """HTTP 401 or 403: the tenant or the credentials are not accepted."""


class PrometheusAuthError(InputError):
    """A tenant, credential or TLS setting or file cannot be used (named in the message)."""


class _Credentials(requests.auth.AuthBase):
    """Tenant and Authorization headers set on each request, so a rotated token file is sent from
    the next query on."""

    def __init__(self, creds: credentials.Credentials) -> None:
        self.creds = creds

    def __call__(self, r: requests.PreparedRequest) -> requests.PreparedRequest:
        r.headers.update(self.creds.headers())
        return r


@dataclass(frozen=True)
class Sample:
    labels: dict[str, str]
    value: float
    timestamp: float


@dataclass(frozen=True)
class Series:
    labels: dict[str, str]
    points: list[tuple[float, float]]


LONG_QUERY = 2000
"""Queries longer than this (bytes) are sent in a POST body (a proxy may allow 8 KiB of URL or less)."""


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
    """prometheus-api-client's :class:`PrometheusConnect` on one ``requests.Session`` per base URL,
    reused for every query; its answers turned into :class:`Sample` / :class:`Series` and its errors
    into this module's one-line ones.

    Queries go as GET parameters (the library sends ``params`` in the URL even with ``method="POST"``)
    up to :data:`LONG_QUERY` bytes; longer ones (a fleet cut into node groups names hundreds of nodes,
    :mod:`rightsizer.clients.chunks`) go as a POST form body on the same session, so no URL limit of
    the server or a proxy in front of it applies."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 60.0,
        headers: dict[str, str] | None = None,
        session: requests.Session | None = None,
        auth: promauth.PrometheusAuth | None = None,
    ) -> None:
        # user:password@ in the URL goes into the Authorization header; the URL shown in messages,
        # plan.json and reports has none. A path prefix (/prometheus) stays in it.
        self.url, basic_auth = split_userinfo(url.rstrip("/"))
        self.timeout = timeout
        settings = auth or promauth.PrometheusAuth()
        try:  # reads the secret and TLS files now: a bad one stops the command before any query
            self._credentials = credentials.Credentials(settings, userinfo=basic_auth)
        except promauth.CredentialError as exc:
            raise PrometheusAuthError(str(exc)) from None
        self._session = session or requests.Session()
        self._session.auth = _Credentials(self._credentials)
        if settings.ca_file is not None:
            self._session.verify = str(settings.ca_file)
        if settings.cert_file is not None:
            key = settings.key_file
            self._session.cert = (str(settings.cert_file), str(key)) if key else str(settings.cert_file)
        if headers:
            self._session.headers.update(headers)
        # errors are ours before the library sees the response (it would raise one generic exception
        # holding the whole body); a non-200 answer never reaches its parsing
        self._session.hooks["response"].append(self._check)
        self._api = PrometheusConnect(
            self.url,
            session=self._session,
            timeout=timeout,
            # the library's default retries 5xx three times with backoff; a failed query is reported
            # at once instead: plan/report exit with one line, serve's job runs again on schedule
            retry=Retry(total=0, raise_on_status=False),
        )
        self.queries = 0
        """Queries sent so far (the analysis reports it; tests check it stays O(slices))."""
        self._count = threading.Lock()  # node groups are queried from several threads

    def close(self) -> None:
        self._api.close()

    def __enter__(self) -> PrometheusClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check(self, resp: requests.Response, *_args: object, **_kwargs: object) -> None:
        """Response hook: a non-200 answer becomes :class:`PrometheusUnavailable` (unreachable, 5xx
        other than a query's own execution error) or :class:`PrometheusQueryError`."""
        if resp.status_code == 200:
            return
        path = resp.request.path_url.split("?", 1)[0] if resp.request is not None else ""
        hint = promauth.status_hint(resp.status_code)
        if hint:
            detail = " ".join(resp.text[:200].split()) or resp.reason
            raise PrometheusDenied(
                self._credentials.scrub(
                    f"Prometheus at {self.url} answered HTTP {resp.status_code} for {path} ({detail}); {hint}"
                )
            )
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
                f"{self.url}{path} answered HTTP {resp.status_code} without a Prometheus API body; "
                "is the URL right?"
            )
        err = str(body.get("error", "unknown error")).splitlines()[0]
        raise PrometheusQueryError(f"Prometheus at {self.url} rejected a query: {err}")

    def _call(self, path: str, query: Callable[[], Any]) -> Any:
        """Run one library query; connection errors and a 200 that is not the API's JSON are ours."""
        with self._count:
            self.queries += 1
        try:
            return query()
        except PrometheusError:
            raise
        except requests.JSONDecodeError as exc:  # also a RequestException: a 200 that is not JSON
            raise PrometheusQueryError(
                f"{self.url}{path} answered HTTP 200 without a Prometheus API body; is the URL right?"
            ) from exc
        except requests.Timeout as exc:
            raise PrometheusUnavailable(
                f"Prometheus at {self.url} did not answer within {self.timeout:.0f}s"
            ) from exc
        except requests.RequestException as exc:
            if promauth.is_tls_failure(exc):  # SSLError, or a peer's alert inside a ConnectionError
                raise PrometheusUnavailable(f"Prometheus at {self.url}: {promauth.tls_failure(exc)}") from exc
            if "RemoteDisconnected" in repr(exc):  # closed before any answer (a refused client cert)
                raise PrometheusUnavailable(
                    f"Prometheus at {self.url}: {promauth.disconnected(self.url)}"
                ) from exc
            raise PrometheusUnavailable(
                f"cannot reach Prometheus at {self.url} ({type(exc).__name__}); is it running? check --prometheus-url"
            ) from exc
        except (ValueError, KeyError, TypeError) as exc:  # the library's ["data"]["result"] of other JSON
            raise PrometheusQueryError(
                f"{self.url}{path} answered HTTP 200 without a Prometheus API body; is the URL right?"
            ) from exc

    def instant(self, query: str, at: float | datetime | None = None) -> list[Sample]:
        """Evaluate ``query`` at ``at`` (Unix seconds or datetime; default now). Vectors and scalars."""
        t = _as_time(at)
        params = {"time": f"{t:.3f}"} if t is not None else {}
        if len(query) > LONG_QUERY:
            result = self._call(
                "/api/v1/query", lambda: self._post("/api/v1/query", {"query": query, **params})
            )
        else:
            result = self._call("/api/v1/query", lambda: self._api.custom_query(query, params=params))
        if _is_scalar(result):
            ts, val = result
            return [Sample({}, _value(val), float(ts))]
        if not isinstance(result, list):
            raise PrometheusQueryError(f"expected a vector from {query!r:.60}, got {type(result).__name__}")
        if any(not isinstance(r, dict) or "value" not in r for r in result):
            raise PrometheusQueryError(f"expected a vector from {query!r:.60}, got a matrix or strings")
        try:
            return [
                Sample(dict(r["metric"]), _value(r["value"][1]), float(r["value"][0]))
                for r in result
                if not math.isnan(_value(r["value"][1]))
            ]
        except (AttributeError, KeyError, TypeError, ValueError, IndexError) as exc:
            raise self._malformed(exc) from None

    def range(self, query: str, start: float | datetime, end: float | datetime, step: float) -> list[Series]:
        """``query_range`` from ``start`` to ``end`` every ``step`` seconds.

        ``nocache=1``: VictoriaMetrics otherwise rounds ``start``/``end`` down to a multiple of
        ``step``, dropping up to one step at the end of the window (an alert that fired in the last
        hour); Prometheus, Thanos and Mimir ignore the parameter."""
        lo, hi = _seconds(start), _seconds(end)
        # the library rounds start and end to whole seconds; its ``params`` are applied last, so
        # they carry the exact times (to the millisecond Prometheus works in; never ':g' rounding)
        exact = {"start": f"{lo:.3f}", "end": f"{hi:.3f}", "nocache": "1"}
        if len(query) > LONG_QUERY:
            form = {"query": query, "step": f"{step:.3f}", **exact}
            result: Any = self._call("/api/v1/query_range", lambda: self._post("/api/v1/query_range", form))
        else:
            result = self._call(
                "/api/v1/query_range",
                lambda: self._api.custom_query_range(
                    query,
                    start_time=datetime.fromtimestamp(lo, UTC),
                    end_time=datetime.fromtimestamp(hi, UTC),
                    step=f"{step:.3f}",
                    params=exact,
                ),
            )
        try:
            return [
                Series(dict(r["metric"]), [(float(t), _value(v)) for t, v in r["values"]])
                for r in result or []
            ]
        except (AttributeError, KeyError, TypeError, ValueError, IndexError) as exc:
            raise self._malformed(exc) from None

    def _post(self, path: str, form: dict[str, str]) -> Any:
        """One query as a form body (``application/x-www-form-urlencoded``), as both Prometheus and
        VictoriaMetrics accept on their query endpoints; the result as the library would return it."""
        resp = self._session.post(f"{self.url}{path}", data=form, timeout=self.timeout)
        return resp.json()["data"]["result"]

    def _malformed(self, exc: Exception) -> PrometheusQueryError:
        """An answer that is JSON but not the Prometheus API's shape (a sample value of "abc")."""
        detail = str(exc).splitlines()[0][:80] if str(exc) else type(exc).__name__
        return PrometheusQueryError(
            f"Prometheus at {self.url} answered with a malformed result ({detail}); "
            "is --prometheus-url a Prometheus-compatible API?"
        )

    def has_data(self, selector: str, *, start: float, end: float) -> bool:
        """Whether any series of ``selector`` has a sample in ``(start, end]``."""
        span = max(1, int(end - start))
        return bool(self.instant(f"count(count_over_time({selector}[{span}s]))", end))


def _seconds(at: float | datetime) -> float:
    t = _as_time(at)
    assert t is not None
    return t


def _is_scalar(result: object) -> bool:
    """A scalar's ``result`` is ``[time, "value"]``; a vector's is a list of objects."""
    return (
        isinstance(result, list)
        and len(result) == 2
        and isinstance(result[0], int | float)
        and isinstance(result[1], str)
    )
