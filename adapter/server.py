"""HTTPS front: TLS handshake per connection in its worker thread, authentication, authorisation,
then :class:`adapter.api.MetricsApi`. Health endpoints answer without credentials (kubelet probes
carry none); everything else needs an identity and, unless ``--authorization-mode none``, a yes from
SubjectAccessReview. 401/403/404/503 are ``metav1.Status`` JSON."""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import orjson
from cryptography import x509

from adapter.api import CUSTOM, EXTERNAL, MetricsApi, request_info, status
from adapter.auth import Authenticator, Authorizer
from adapter.errors import AdapterError, TooManyRequests
from adapter.selfmetrics import SelfMetrics

log = logging.getLogger(__name__)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: AdapterHTTPServer
    server_version = "gpupilot-adapter"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def _peer_cert(self) -> x509.Certificate | None:
        conn = self.connection
        if not isinstance(conn, ssl.SSLSocket):
            return None
        der = conn.getpeercert(binary_form=True)
        return x509.load_der_x509_certificate(der) if der else None

    def _send(self, code: int, body: dict[str, Any] | str | bytes, *, content_type: str = "") -> None:
        if isinstance(body, dict):
            # orjson: a 500-item MetricValueList encodes in 0.15 ms instead of 2 ms (json.dumps).
            data, ctype = orjson.dumps(body), "application/json"
        elif isinstance(body, str):
            data, ctype = body.encode(), "text/plain; charset=utf-8"
        else:
            data, ctype = body, content_type or "application/octet-stream"
        self.send_response(code)
        self.send_header("Content-Type", content_type or ctype)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        start = time.perf_counter()
        app = self.server.app
        url = urlsplit(self.path)
        path = url.path or "/"
        query = dict(parse_qsl(url.query, keep_blank_values=True))
        info = request_info(path)
        kind = "other"
        if info.is_resource:
            kind = "external" if info.group == EXTERNAL else "custom"
        elif path.startswith((f"/apis/{CUSTOM}", f"/apis/{EXTERNAL}")):
            kind = "discovery"
        code = 500
        try:
            if path.rstrip("/") not in app.always_allow_paths:
                headers = {k: self.headers.get_all(k) or [] for k in set(self.headers.keys())}
                user = app.authenticator.authenticate(peer_cert=self._peer_cert(), headers=headers)
                app.authorizer.authorize(user, info)
            if path == "/metrics":
                code = 200
                self._send(
                    200, app.metrics.exposition(), content_type="text/plain; version=0.0.4; charset=utf-8"
                )
                return
            if info.is_resource:
                # metric answers hold whole Prometheus results in memory: bound how many at once
                if not app.inflight.acquire(timeout=app.inflight_wait):
                    raise TooManyRequests(
                        f"more than {app.max_inflight} metric requests in flight for {app.inflight_wait:g}s; retry"
                    )
                try:
                    code, body = app.api.answer(path, query)
                finally:
                    app.inflight.release()
            else:
                code, body = app.api.answer(path, query)
            self._send(code, body)
        except AdapterError as exc:
            code = exc.status
            if code in (401, 403):
                app.metrics.auth_failures.labels(str(code)).inc()
            self._send(code, status(code, exc.reason, str(exc)))
        except Exception:  # a bug must not kill the connection without an answer
            log.exception("unhandled error serving %s", path)
            code = 500
            self._send(
                500, status(500, "InternalError", f"internal error serving {path}; see the adapter log")
            )
        finally:
            app.metrics.requests.labels(kind, str(code)).inc()
            app.metrics.request_seconds.labels(kind).observe(time.perf_counter() - start)

    def _not_allowed(self) -> None:
        self._send(
            405, status(405, "MethodNotAllowed", f"{self.command} is not supported; this API is read-only")
        )

    do_POST = do_PUT = do_PATCH = do_DELETE = _not_allowed


class App:
    """What a request needs; swapped parts (config) are reached through callables."""

    def __init__(
        self,
        *,
        api: MetricsApi,
        authenticator: Authenticator,
        authorizer: Authorizer,
        metrics: SelfMetrics,
        always_allow_paths: frozenset[str],
        max_inflight: int = 4,
        inflight_wait: float = 10.0,
    ) -> None:
        self.api = api
        self.max_inflight = max_inflight
        self.inflight = threading.BoundedSemaphore(max_inflight)
        self.inflight_wait = inflight_wait
        self.authenticator = authenticator
        self.authorizer = authorizer
        self.metrics = metrics
        self.always_allow_paths = always_allow_paths


class AdapterHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(
        self,
        address: tuple[str, int],
        *,
        app: App,
        ssl_context: ssl.SSLContext,
        handshake_timeout: float = 10.0,
    ) -> None:
        self.app = app
        self.ssl_context = ssl_context
        self.handshake_timeout = handshake_timeout
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, Handler)

    def finish_request(self, request: Any, client_address: Any) -> None:
        """Handshake in the worker thread, so one slow client cannot stall accept()."""
        request.settimeout(self.handshake_timeout)
        try:
            tls = self.ssl_context.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError) as exc:
            log.debug("TLS handshake with %s failed: %s", client_address, exc)
            return
        try:
            tls.settimeout(60)
            Handler(tls, client_address, self)
        finally:
            with contextlib.suppress(OSError):
                tls.close()

    @property
    def port(self) -> int:
        return int(self.server_address[1])


def serve_in_thread(server: AdapterHTTPServer) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
    thread.start()
    return thread
