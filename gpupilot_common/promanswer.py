"""The one reader of Prometheus HTTP API answers: answer bytes → samples, each failure → one class.

Every door to Prometheus (the adapter on aiohttp, the rightsizer on prometheus-api-client's
``requests`` session, the devkit's urllib helper) sends its request its own way and hands the answer
here: the body is fed chunk by chunk into an :class:`AnswerBody`, which stops reading as soon as the
answer is over ``max_bytes`` or visibly holds more than ``max_series`` series, so memory stays
bounded by the limits, not by what the server sends. :func:`decode` then turns status and body into
the API's ``data`` or raises one of::

    PrometheusFailure               one line naming the server; ``temporary`` says whether to retry
    ├── PrometheusUnreachable       connection refused/reset, DNS, TLS (temporary)
    ├── PrometheusTimeout           no complete answer within the deadline (temporary)
    ├── PrometheusServerError       5xx without the API's error body (temporary)
    ├── PrometheusDenied            401/403: the tenant or credentials are not accepted
    ├── PrometheusQueryError        Prometheus' own error text (``error``/``errorType``), also on
    │                               an HTTP 200 whose status is "error"
    ├── PrometheusBadAnswer         not JSON (truncated?), or JSON that is not the API's shape
    └── PrometheusAnswerTooLarge    over the series or byte limit; names the query and the limit

Each service maps these to its own error tree at its door (the adapter answers 503, the rightsizer
exits 1). :func:`vector`, :func:`matrix` and :func:`names` read ``data`` into :class:`Sample`,
:class:`Series` and metric names; values are floats as given (NaN and ±Inf included): what a value
may be is for the service to decide.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson

from gpupilot_common import promauth
from gpupilot_common.text import OneLineMessage


class PrometheusFailure(OneLineMessage):
    """Base class; ``str()`` is one line naming the server (never its credentials)."""

    temporary = False


class PrometheusUnreachable(PrometheusFailure):
    temporary = True


class PrometheusTimeout(PrometheusFailure):
    temporary = True


class PrometheusServerError(PrometheusFailure):
    temporary = True


class PrometheusDenied(PrometheusFailure):
    pass


class PrometheusQueryError(PrometheusFailure):
    pass


class PrometheusBadAnswer(PrometheusFailure):
    pass


class PrometheusAnswerTooLarge(PrometheusFailure):
    pass


class Sample(NamedTuple):
    """One element of an instant vector (or a scalar, with no labels): labels, value, evaluation
    time (Unix seconds). A named tuple: an answer holds one per series, built cheaply."""

    labels: Mapping[str, str]
    value: float
    timestamp: float


class Series(NamedTuple):
    """One series of a range query: labels and (Unix time, value) points in time order."""

    labels: Mapping[str, str]
    points: list[tuple[float, float]]


@dataclass(frozen=True)
class AnswerLimits:
    """How much one answer may hold; over either, the query fails with
    :class:`PrometheusAnswerTooLarge` and the rest of the answer is not read."""

    max_series: int = 100_000
    """Series (vector elements or range series) in one answer. A namespace of 5,000 pods answers
    5,000; 100,000 parse into about 100 MB of Python objects."""
    max_bytes: int = 64 << 20
    """Bytes of the (decompressed) answer body."""
    series_flag: str = "--max-answer-series"
    bytes_flag: str = "--max-answer-bytes"
    """The settings users change the limits with, named in the error."""

    def __post_init__(self) -> None:
        if self.max_series < 1 or self.max_bytes < 1024:
            raise ValueError("answer limits: at least 1 series and 1024 bytes")


_SERIES_MARK = b'"metric":{'
_LABEL_MARK = b'":"'
"""Between a label's name and its value: counts the label pairs of an answer (a value that holds
the same three bytes counts twice: the count errs high, never low)."""
"""Opens each series object in the compact JSON every Prometheus-compatible server sends. It cannot
occur inside a JSON string (quotes there are escaped), so counting it counts series without parsing;
a server that pretty-prints is still bounded by the byte limit and counted again after parsing."""


def _shown(query: str) -> str:
    one = " ".join(query.split())
    return one if len(one) <= 80 else one[:77] + "..."


class AnswerBody:
    """The body of one answer, fed chunk by chunk; raises :class:`PrometheusAnswerTooLarge` as soon
    as it is over a limit, so a caller stops reading (and closes the connection) at once."""

    def __init__(self, *, url: str, query: str, limits: AnswerLimits) -> None:
        self.url, self.query, self.limits = url, query, limits
        self._chunks: list[bytes] = []
        self._size = 0
        self._series = 0
        self._labels = 0
        self._tail = b""

    def feed(self, chunk: bytes) -> None:
        if not chunk:
            return
        self._size += len(chunk)
        if self._size > self.limits.max_bytes:
            self.discard()
            raise self.too_large(f"more than {self.limits.max_bytes:,} bytes ({self.limits.bytes_flag})")
        window = self._tail + chunk
        self._series += window.count(_SERIES_MARK)
        # the tail is shorter than a series mark but may hold whole label marks: those were counted
        self._labels += window.count(_LABEL_MARK) - self._tail.count(_LABEL_MARK)
        self._tail = window[-(len(_SERIES_MARK) - 1) :]
        if self._series > self.limits.max_series:
            self.discard()
            raise self.too_many()
        self._chunks.append(chunk)

    def discard(self) -> None:
        """Drop what was read (a refused answer): nothing that still references this body, such as
        an error's traceback, keeps the bytes alive."""
        self._chunks = []

    def too_many(self) -> PrometheusAnswerTooLarge:
        return self.too_large(f"more than {self.limits.max_series:,} series ({self.limits.series_flag})")

    def too_large(self, what: str) -> PrometheusAnswerTooLarge:
        return PrometheusAnswerTooLarge(
            f"Prometheus at {self.url}: the answer to {_shown(self.query)!r} holds {what}; "
            "narrow the query or raise the limit"
        )

    @property
    def size(self) -> int:
        return self._size

    @property
    def series(self) -> int:
        """Series seen so far (``"metric":{`` marks)."""
        return self._series

    @property
    def labels(self) -> int:
        """Label pairs seen so far (``":"`` marks; see :data:`_LABEL_MARK`)."""
        return self._labels

    def bytes(self) -> bytes:
        data = b"".join(self._chunks)
        self._chunks = [data]
        return data


def decode(status: int, reason: str, body: AnswerBody, *, path: str) -> dict[str, Any]:
    """The API's ``data`` object of a successful answer; otherwise the one failure it shows."""
    url, raw = body.url, body.bytes()
    hint = promauth.status_hint(status)
    if hint:
        detail = _api_error(raw) or " ".join(raw[:200].decode(errors="replace").split()) or reason
        raise PrometheusDenied(f"Prometheus at {url} answered HTTP {status} for {path} ({detail}); {hint}")
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if exc.msg.startswith("Not enough memory"):  # orjson's MemoryError, not the answer's fault
            raise PrometheusAnswerTooLarge(
                f"Prometheus at {url}: not enough memory to parse the answer to {_shown(body.query)!r} "
                f"({len(raw):,} bytes); narrow the query, lower {body.limits.bytes_flag} or give the "
                "process more memory"
            ) from None
        if 200 <= status < 300:
            raise PrometheusBadAnswer(f"{url}{path}{_not_json(raw, exc)}") from None
        doc = None
    if isinstance(doc, dict) and doc.get("status") == "error":
        kind = doc.get("errorType")
        if status >= 500 and kind not in ("execution", "bad_data", "timeout", None):
            raise PrometheusServerError(
                f"Prometheus at {url} answered HTTP {status} for {path}: {_error(doc)}"
            )
        raise PrometheusQueryError(f"Prometheus at {url} refused the query ({_error(doc)})")
    if status >= 500:
        raise PrometheusServerError(f"Prometheus at {url} answered HTTP {status} for {path}")
    if status != 200 or not isinstance(doc, dict) or doc.get("status") != "success":
        raise PrometheusBadAnswer(
            f"{url}{path} answered HTTP {status}, not a Prometheus API body; is the URL right?"
        )
    data = doc.get("data")
    if not isinstance(data, dict) and not (isinstance(data, list) and path.endswith("/values")):
        raise PrometheusBadAnswer(f"{url}{path} answered without the API's 'data'; is the URL right?")
    return {"names": data} if isinstance(data, list) else data


def _api_error(raw: bytes) -> str:
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return ""
    return _error(doc) if isinstance(doc, dict) and "error" in doc else ""


def _error(doc: Mapping[str, Any]) -> str:
    text = " ".join(str(doc.get("error") or "no error text").split())
    kind = doc.get("errorType")
    return f"{kind}: {text}" if kind else text


def _not_json(raw: bytes, exc: orjson.JSONDecodeError) -> str:
    """'truncated' when the parser ran out of input (the answer stopped early), else where it broke."""
    start = raw.lstrip()[:1]
    if not start:
        return " answered an empty body, not a Prometheus API body; is the URL right?"
    if start not in (b"{", b"["):
        shown = raw.lstrip()[:16].decode(errors="replace")
        return f" answered {shown!r}…, not a Prometheus API body; is the URL right?"
    if "end of data" in exc.msg or exc.pos >= len(raw):
        return f": answer is not valid JSON (truncated after {len(raw):,} bytes)"
    return f": answer is not valid JSON (at byte {exc.pos:,} of {len(raw):,})"


def _malformed(url: str, exc: Exception) -> PrometheusBadAnswer:
    detail = str(exc).splitlines()[0][:80] if str(exc) else type(exc).__name__
    return PrometheusBadAnswer(
        f"Prometheus at {url} answered with a malformed result ({detail}); "
        "is the URL a Prometheus-compatible API?"
    )


def vector(data: Mapping[str, Any], body: AnswerBody) -> list[Sample]:
    """An instant query's samples (a scalar gives one sample without labels)."""
    kind = data.get("resultType")
    result: Sequence[Any] = data.get("result") or []
    try:
        if kind == "scalar":
            ts, raw = result
            return [Sample({}, float(raw), float(ts))]
        if kind != "vector":
            raise PrometheusBadAnswer(
                f"Prometheus at {body.url} returned a {kind!r} result for {_shown(body.query)!r}; "
                "the query must give an instant vector"
            )
        if len(result) > body.limits.max_series:
            raise body.too_many()
        out = []
        for item in result:
            ts, raw = item["value"]
            labels = item.get("metric", {})
            if not isinstance(labels, dict):
                raise TypeError(f"labels are {type(labels).__name__}")
            out.append(Sample(labels, float(raw), float(ts)))
        return out
    except (AttributeError, KeyError, TypeError, ValueError, IndexError) as exc:
        raise _malformed(body.url, exc) from None


def matrix(data: Mapping[str, Any], body: AnswerBody) -> list[Series]:
    """A range query's series."""
    result: Sequence[Any] = data.get("result") or []
    if data.get("resultType") not in ("matrix", None):
        raise PrometheusBadAnswer(
            f"Prometheus at {body.url} returned a {data.get('resultType')!r} result to a range query"
        )
    if len(result) > body.limits.max_series:
        raise body.too_many()
    try:
        out = []
        for item in result:
            labels = item.get("metric", {})
            if not isinstance(labels, dict):
                raise TypeError(f"labels are {type(labels).__name__}")
            out.append(Series(labels, [(float(t), float(v)) for t, v in item.get("values") or []]))
        return out
    except (AttributeError, KeyError, TypeError, ValueError, IndexError) as exc:
        raise _malformed(body.url, exc) from None


def names(data: Mapping[str, Any]) -> list[str]:
    """``/api/v1/label/…/values``: the names."""
    return [str(n) for n in data.get("names") or []]


def timed_out(url: str, seconds: float, *, flag: str) -> PrometheusTimeout:
    """The deadline passed before the whole answer arrived (slow server, or a huge answer)."""
    return PrometheusTimeout(
        f"Prometheus at {url}: no complete answer, timed out after {seconds:g} s ({flag})"
    )


def unreachable(url: str, cause: str, *, flag: str) -> PrometheusUnreachable:
    """No answer at all: ``cause`` in a few words (``connection refused``, a TLS failure)."""
    return PrometheusUnreachable(f"cannot reach Prometheus at {url}: {cause}; is it running? check {flag}")
