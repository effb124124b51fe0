"""Record the Prometheus API requests a client sends, replay them on other servers, compare answers.

:class:`RecordingProxy` sits between a client (the adapter, the rightsizer) and a real Prometheus on
a loopback port: it forwards every request unchanged and keeps its path, its parameters (query string
and form body) and when it was sent. :func:`replay` asks one server each recorded read with its time
made explicit (an instant query without ``time`` is asked at the moment it was sent), so the same
request means the same thing on every server, whenever it is replayed. :func:`differences` names each
request whose answers differ, with both answers: the same series, the same timestamps, and values
equal to :data:`REL_TOL` (Prometheus 3 sums ``avg``, ``sum``, ``*_over_time`` with Kahan
compensation, 2.42 did not: 0.963312 against 0.9633120000000001 is the same answer; a sample more or
less in a window is not).
"""

from __future__ import annotations

import json
import math
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

REL_TOL = 1e-9
"""Relative tolerance between two sample values (float summation order, nothing else)."""
COMPARED = ("/api/v1/query", "/api/v1/query_range", "/api/v1/series", "/api/v1/labels", "/api/v1/label/")
"""The reads whose answers depend on the data only (not on the server's build, flags or uptime)."""


@dataclass(frozen=True)
class Recorded:
    path: str
    params: tuple[tuple[str, str], ...]
    at: float
    """Wall-clock time the client sent it."""

    def explicit(self) -> tuple[tuple[str, str], ...]:
        """The parameters with the evaluation time written out."""
        keys = {k for k, _ in self.params}
        if self.path == "/api/v1/query" and "time" not in keys:
            return (*self.params, ("time", f"{self.at:.3f}"))
        return self.params

    def describe(self) -> str:
        shown = {k: v for k, v in self.explicit()}
        query = shown.pop("query", shown.pop("match[]", ""))
        rest = " ".join(f"{k}={v}" for k, v in sorted(shown.items()))
        return f"{self.path} {query} [{rest}]"


class RecordingProxy:
    """A forwarding HTTP proxy on 127.0.0.1 that records every request (use as a context manager)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.recorded: list[Recorded] = []
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                split = urllib.parse.urlsplit(self.path)
                params = urllib.parse.parse_qsl(split.query, keep_blank_values=True)
                if body and "form-urlencoded" in (self.headers.get("Content-Type") or ""):
                    params += urllib.parse.parse_qsl(body.decode(), keep_blank_values=True)
                with proxy._lock:
                    proxy.recorded.append(Recorded(split.path, tuple(params), time.time()))
                headers = {
                    k: v
                    for k, v in self.headers.items()
                    if k.lower() in {"content-type", "accept", "accept-encoding", "authorization"}
                }
                req = urllib.request.Request(
                    proxy.upstream + self.path, data=body, method=method, headers=headers
                )
                try:
                    with urllib.request.urlopen(req, timeout=300) as r:
                        status, answer, got = r.status, r.read(), r.headers
                except urllib.error.HTTPError as exc:
                    status, answer, got = exc.code, exc.read(), exc.headers
                self.send_response(status)
                for key in ("Content-Type", "Content-Encoding"):
                    if got.get(key):
                        self.send_header(key, got[key])
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def do_GET(self) -> None:
                self._forward("GET")

            def do_POST(self) -> None:
                self._forward("POST")

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> RecordingProxy:
        threading.Thread(target=self.server.serve_forever, name="recording-proxy", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def reads(self) -> list[Recorded]:
        """The recorded requests whose answers are compared, each distinct one once, in order."""
        seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
        out = []
        with self._lock:
            for rec in self.recorded:
                key = (rec.path, rec.explicit())
                if rec.path.startswith(COMPARED) and key not in seen:
                    seen.add(key)
                    out.append(rec)
        return out


def _canonical(data: Any) -> Any:
    """An answer's ``data`` with its series in a stable order (Prometheus does not promise one)."""
    if isinstance(data, dict) and isinstance(data.get("result"), list):
        rows = sorted(data["result"], key=lambda r: json.dumps(r.get("metric", {}), sort_keys=True))
        return {**data, "result": rows}
    if isinstance(data, list):
        return sorted(data, key=lambda r: json.dumps(r, sort_keys=True))
    return data


def ask(url: str, rec: Recorded) -> Any:
    """One recorded read on the server at ``url``: its ``data``, or ``{"error": …}``."""
    form = urllib.parse.urlencode(rec.explicit())
    if rec.path.startswith("/api/v1/label/"):  # GET only
        req = urllib.request.Request(f"{url}{rec.path}?{form}")
    else:
        req = urllib.request.Request(
            f"{url}{rec.path}",
            data=form.encode(),
            method="POST",
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            raw = r.read()
    except urllib.error.HTTPError as exc:
        raw = exc.read()
    try:
        answer = json.loads(raw)
    except ValueError:
        return {"error": raw.decode(errors="replace").strip()[:200]}
    if answer.get("status") != "success":
        return {"error": answer.get("errorType", "?") + ": " + str(answer.get("error", answer))}
    return _canonical(answer["data"])


def replay(url: str, recorded: Iterable[Recorded]) -> list[Any]:
    return [ask(url, rec) for rec in recorded]


@dataclass(frozen=True)
class Difference:
    request: Recorded
    reference: Any
    other: Any

    def __str__(self) -> str:
        def short(answer: Any) -> str:
            text = json.dumps(answer, sort_keys=True)
            return text if len(text) <= 600 else text[:600] + f"… ({len(text):,} characters)"

        return f"{self.request.describe()}\n    reference: {short(self.reference)}\n    other:     {short(self.other)}"


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def same(a: Any, b: Any) -> bool:
    """Equal answers: equal structure and strings, sample values equal to :data:`REL_TOL`."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, str) and isinstance(b, str) and a != b:
        x, y = _number(a), _number(b)
        if x is None or y is None:
            return False
        return (math.isnan(x) and math.isnan(y)) or math.isclose(x, y, rel_tol=REL_TOL, abs_tol=1e-12)
    return bool(a == b)


def differences(
    recorded: Sequence[Recorded], reference: Sequence[Any], other: Sequence[Any]
) -> list[Difference]:
    return [
        Difference(rec, a, b) for rec, a, b in zip(recorded, reference, other, strict=True) if not same(a, b)
    ]
