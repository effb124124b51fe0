"""The rightsizer's one door to Prometheus (or anything speaking its HTTP API: Thanos, Mimir, VM).

A small generic API returning plain Python data — :meth:`PrometheusClient.instant` and
:meth:`PrometheusClient.range` — used by the analysis and the weekly report alike. Answers are read
by :mod:`gpupilot_common.promanswer` (bounded: ``--max-answer-series``/``--max-answer-bytes``), whose
failures map to::

    PrometheusError                 base class, one-line messages
    ├── PrometheusUnavailable       could not connect / timed out / 5xx (temporary: retry later)
    └── PrometheusQueryError        the server rejected the query, or its answer is unusable or over
        │                           the limits (permanent: fix the query, URL or limit)
        └── PrometheusDenied        401/403: the tenant or credentials are wrong
    PrometheusAuthError             (an InputError) a tenant, credential or TLS flag or file is wrong

Tenant, basic auth, bearer token file (re-read when it changes), CA bundle and client certificate:
:mod:`gpupilot_common.promauth`, the same settings as the adapter's.
"""

from __future__ import annotations

import math
import threading
import time
import urllib.parse
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import requests
from prometheus_api_client import PrometheusConnect
from urllib3.util.retry import Retry

from gpupilot_common import credentials, promanswer, promauth, urllib3deadline, watchdog
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


class PrometheusAnswerTooLarge(PrometheusQueryError):
    """The answer holds more series or bytes than ``--max-answer-series``/``--max-answer-bytes``
    allow; a caller that can ask in parts does (:func:`rightsizer.clients.chunks.by_pod_name`)."""


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


Sample = promanswer.Sample
Series = promanswer.Series

DEFAULT_LIMITS = promanswer.AnswerLimits(max_series=200_000, max_bytes=128 << 20)
"""Per answer. A fleet of 10,000 GPUs with seven slices each answers 70,000 series per statistic;
128 MiB of answer parse into well under 1 GiB."""

CHUNK = 1 << 16

_EMPTY = b'{"status":"success","data":{"resultType":"vector","result":[]}}'
"""What prometheus-api-client is left to parse once :mod:`promanswer` has read the answer."""


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
        limits: promanswer.AnswerLimits = DEFAULT_LIMITS,
    ) -> None:
        # user:password@ in the URL goes into the Authorization header; the URL shown in messages,
        # plan.json and reports has none. A path prefix (/prometheus) stays in it.
        self.url, basic_auth = split_userinfo(url.rstrip("/"))
        self._prefix = urllib.parse.urlsplit(self.url).path.rstrip("/")
        """A path prefix of the URL (``/prometheus`` on Mimir): messages name ``url`` + API path, once."""
        self.timeout = timeout
        self.limits = limits
        self._local = threading.local()  # node groups are queried from several threads
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
        # the answer is read (bounded) and its errors are ours before the library sees the response
        # (it would read any size, and raise one generic exception holding the whole body)
        self._session.hooks["response"].append(self._read)
        self._api = PrometheusConnect(
            self.url,
            session=self._session,
            timeout=timeout,
            # the library's default retries 5xx three times with backoff; a failed query is reported
            # at once instead: plan/report exit with one line, serve's job runs again on schedule
            retry=Retry(total=0, raise_on_status=False),
        )
        for adapter in self._session.adapters.values():  # the library mounts one for the URL too
            if isinstance(adapter, requests.adapters.HTTPAdapter):  # every answer within --timeout
                urllib3deadline.bound(adapter.poolmanager)
        self.queries = 0
        """Queries sent so far (the analysis reports it; tests check it stays O(slices))."""
        self._count = threading.Lock()  # node groups are queried from several threads

    def close(self) -> None:
        self._api.close()

    def __enter__(self) -> PrometheusClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _read(self, resp: requests.Response, *_args: object, **_kwargs: object) -> requests.Response:
        """Response hook (it runs before ``requests`` reads the body): the body read here in chunks,
        bounded by the limits and the deadline, decoded by :mod:`gpupilot_common.promanswer`; the
        library is left a small empty answer to parse. Failures leave as the shared reader's."""
        path = resp.request.path_url.split("?", 1)[0] if resp.request is not None else ""
        if self._prefix and path.startswith(f"{self._prefix}/"):  # the URL already holds the prefix
            path = path[len(self._prefix) :]
        query = getattr(self._local, "query", path)
        body = promanswer.AnswerBody(url=self.url, query=query, limits=self.limits)
        deadline = getattr(self._local, "deadline", None)
        whole = False
        try:
            for chunk in resp.iter_content(CHUNK):
                body.feed(chunk)
                if deadline is not None and time.monotonic() > deadline:
                    raise promanswer.timed_out(self.url, self.timeout, flag="--timeout")
            whole = True
        finally:
            resp.close()  # over a limit or past the deadline: the rest is not read
            if not whole:  # refused, timed out or cut off: what was read goes now, not with the error
                body.discard()
        self._local.answer = (promanswer.decode(resp.status_code, resp.reason or "", body, path=path), body)
        # requests has no public way to say what was read: the library parses this small answer
        resp._content = _EMPTY
        resp._content_consumed = True  # type: ignore[attr-defined]
        return resp

    def _call(
        self, path: str, query: str, send: Callable[[], object]
    ) -> tuple[dict[str, Any], promanswer.AnswerBody]:
        """Send one query through the library's session; the answer as the reader decoded it."""
        with self._count:
            self.queries += 1
        self._local.query = query
        self._local.deadline = time.monotonic() + self.timeout
        self._local.answer = None
        # The error is raised after the handler, with no __context__: the failure caught here holds
        # the reading frames in its traceback, and a kept error (serve records its last one) must
        # not keep them, or the chunk being read, alive.
        failure: PrometheusError | None = None
        try:
            with watchdog.within(self.timeout):
                send()
        except promanswer.PrometheusFailure as exc:
            failure = _ours(exc)
        except requests.RequestException as exc:
            failure = self._failure(exc)
        finally:
            self._local.query = None
        if failure is not None:
            self._local.answer = None
            raise failure from None
        answer: tuple[dict[str, Any], promanswer.AnswerBody] | None = self._local.answer
        self._local.answer = None
        if answer is None:  # a redirect chain or a hook skipped: never expected
            raise PrometheusQueryError(f"{self.url}{path} gave no answer to read")
        return answer

    def _failure(self, exc: requests.RequestException) -> PrometheusError:
        """A ``requests`` failure as one line (its text only: nothing of it is kept)."""
        deadline = getattr(self._local, "deadline", None)
        cut = deadline is not None and time.monotonic() >= deadline  # the watchdog ended the answer
        if cut or isinstance(exc, requests.Timeout) or "Read timed out" in str(exc):  # also while streaming
            return _ours(promanswer.timed_out(self.url, self.timeout, flag="--timeout"))
        if promauth.is_tls_failure(exc):  # SSLError, or a peer's alert inside a ConnectionError
            return PrometheusUnavailable(f"Prometheus at {self.url}: {promauth.tls_failure(exc)}")
        # closed or reset before any answer: how a TLS 1.3 server refuses a client certificate
        if "RemoteDisconnected" in repr(exc) or "ConnectionResetError" in repr(exc):
            return PrometheusUnavailable(f"Prometheus at {self.url}: {promauth.disconnected(self.url)}")
        return _ours(promanswer.unreachable(self.url, _cause(exc), flag="--prometheus-url"))

    def instant(self, query: str, at: float | datetime | None = None) -> list[Sample]:
        """Evaluate ``query`` at ``at`` (Unix seconds or datetime; default now). Vectors and scalars.
        NaN and ±Inf values are dropped (a statistic of them means nothing)."""
        t = _as_time(at)
        params = {"time": f"{t:.3f}"} if t is not None else {}
        path = "/api/v1/query"
        if len(query) > LONG_QUERY:
            data, body = self._call(path, query, lambda: self._post(path, {"query": query, **params}))
        else:
            data, body = self._call(path, query, lambda: self._api.custom_query(query, params=params))
        try:
            samples = promanswer.vector(data, body)
        except promanswer.PrometheusFailure as exc:
            raise _ours(exc) from None
        return [s for s in samples if math.isfinite(s.value)]

    def range(self, query: str, start: float | datetime, end: float | datetime, step: float) -> list[Series]:
        """``query_range`` from ``start`` to ``end`` every ``step`` seconds.

        ``nocache=1``: VictoriaMetrics otherwise rounds ``start``/``end`` down to a multiple of
        ``step``, dropping up to one step at the end of the window (an alert that fired in the last
        hour); Prometheus, Thanos and Mimir ignore the parameter."""
        lo, hi = _seconds(start), _seconds(end)
        # the library rounds start and end to whole seconds; its ``params`` are applied last, so
        # they carry the exact times (to the millisecond Prometheus works in; never ':g' rounding)
        exact = {"start": f"{lo:.3f}", "end": f"{hi:.3f}", "nocache": "1"}
        path = "/api/v1/query_range"
        if len(query) > LONG_QUERY:
            form = {"query": query, "step": f"{step:.3f}", **exact}
            data, body = self._call(path, query, lambda: self._post(path, form))
        else:
            data, body = self._call(
                path,
                query,
                lambda: self._api.custom_query_range(
                    query,
                    start_time=datetime.fromtimestamp(lo, UTC),
                    end_time=datetime.fromtimestamp(hi, UTC),
                    step=f"{step:.3f}",
                    params=exact,
                ),
            )
        try:
            return promanswer.matrix(data, body)
        except promanswer.PrometheusFailure as exc:
            raise _ours(exc) from None

    def _post(self, path: str, form: dict[str, str]) -> None:
        """One query as a form body (``application/x-www-form-urlencoded``), as both Prometheus and
        VictoriaMetrics accept on their query endpoints, on the library's session (read by the hook)."""
        self._session.post(f"{self.url}{path}", data=form, timeout=self.timeout)

    def has_data(self, selector: str, *, start: float, end: float) -> bool:
        """Whether any series of ``selector`` has a sample in ``(start, end]``."""
        span = max(1, int(end - start))
        return bool(self.instant(f"count(count_over_time({selector}[{span}s]))", end))


def _ours(exc: promanswer.PrometheusFailure) -> PrometheusError:
    """The shared reader's failure in the rightsizer's tree: temporary ones are unavailability."""
    if isinstance(exc, promanswer.PrometheusDenied):
        return PrometheusDenied(str(exc))
    if isinstance(exc, promanswer.PrometheusAnswerTooLarge):
        return PrometheusAnswerTooLarge(str(exc))
    return (PrometheusUnavailable if exc.temporary else PrometheusQueryError)(str(exc))


def _cause(exc: requests.RequestException) -> str:
    """The root cause in a few words (``connection refused``), not urllib3's whole chain."""
    text = str(exc)
    for known in ("Connection refused", "Name or service not known", "Connection reset", "No route to host"):
        if known in text:
            return known.lower()
    return type(exc).__name__


def _seconds(at: float | datetime) -> float:
    t = _as_time(at)
    assert t is not None
    return t
