"""KEDA's ``externalscaler.ExternalScaler`` over gRPC (grpc.aio in a thread of its own): the only
adapter module that imports grpc.

Unary calls whose answer is in memory are answered on the event loop; one that waits on Prometheus
(a metric's first evaluation) goes to a small thread pool. ``StreamIsActive`` holds no thread: it
reads the value once per refresh interval and pushes when the activity changes (and at once when
opened); it ends when the client goes away or the server stops. Errors map to gRPC codes:
bad metadata INVALID_ARGUMENT, no value NOT_FOUND, Prometheus failing or values too old
UNAVAILABLE. The serving certificate and client CA are re-read when their files change (checked at
each new connection's handshake); material that does not parse, or a key that does not match the
certificate, is logged as a failed reload, counted, and the previous material stays in use.

KEDA keeps every ScaledObject of one scaler address on one connection, so streams and unary calls
are bounded apart, never by HTTP/2's per-connection stream limit (past which a client queues
every call silently): at most ``max_streams`` open streams and ``max_unary`` unary calls in flight,
the next of either kind answered RESOURCE_EXHAUSTED at once; the first evaluations of streams and
of unary calls run on separate thread pools; and a call waits at most ``--prometheus-timeout`` for
a first evaluation, however many are queued, then gets UNAVAILABLE.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from adapter.config.settings import ScalerSettings
from adapter.errors import (
    AdapterError,
    BadRequest,
    ConfigError,
    NotFound,
    TooManyRequests,
    UpstreamUnavailable,
)
from adapter.provider import nowait
from adapter.serving.keda import externalscaler_pb2 as pb
from adapter.serving.keda import externalscaler_pb2_grpc as pb_grpc
from adapter.serving.keda.scaler import Reading, Scaler
from adapter.serving.selfmetrics import RequestStats
from gpupilot_common import loops, yamlsafe

log = logging.getLogger(__name__)
T = TypeVar("T")

_CODES: tuple[tuple[type[AdapterError], grpc.StatusCode], ...] = (
    (BadRequest, grpc.StatusCode.INVALID_ARGUMENT),
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (TooManyRequests, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (UpstreamUnavailable, grpc.StatusCode.UNAVAILABLE),
)


_INT64 = 2**63 - 1


def int64(value: float) -> int:
    """The deprecated integer fields: rounded, and clamped to int64 (protobuf refuses more)."""
    return max(-_INT64, min(_INT64, round(value)))


def status_code(exc: AdapterError) -> grpc.StatusCode:
    for kind, code in _CODES:
        if isinstance(exc, kind):
            return code
    return grpc.StatusCode.INTERNAL


def _read_file(path: Path, flag: str) -> bytes:
    try:
        return yamlsafe.read_bytes(path)  # a regular file only
    except OSError as exc:
        raise ConfigError(f"{flag} {path}: cannot read: {exc.strerror or exc}") from None


def server_options(s: ScalerSettings) -> list[tuple[str, int]]:
    """gRPC core's channel arguments for the scaler's bounds (``ScalerSettings``)."""
    return [
        ("grpc.so_reuseport", 0),  # a port already taken is an error, not shared with another process
        ("grpc.max_receive_message_length", s.max_message_bytes),
        ("grpc.max_send_message_length", s.max_message_bytes),
        ("grpc.max_concurrent_streams", s.max_streams_per_connection),
        ("grpc.keepalive_time_ms", int(s.keepalive_time * 1000)),
        ("grpc.keepalive_timeout_ms", int(s.keepalive_timeout * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", int(s.min_client_ping_interval * 1000)),
        ("grpc.http2.max_ping_strikes", 2),
        ("grpc.max_connection_idle_ms", int(s.max_connection_idle * 1000)),
    ]


def _checked(pems: list[bytes], flags: list[str]) -> None:
    """ConfigError unless the certificate chain, the key (matching it) and the CA parse: gRPC takes
    any bytes here and keeps its previous material when they are unusable, without saying so."""
    try:
        chain = x509.load_pem_x509_certificates(pems[0])
    except ValueError:
        raise ConfigError(f"{flags[0]}: not a PEM certificate") from None
    try:
        key = serialization.load_pem_private_key(pems[1], password=None)
    except (ValueError, TypeError):
        raise ConfigError(f"{flags[1]}: not an unencrypted PEM private key") from None
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    encoding = serialization.Encoding.DER
    if key.public_key().public_bytes(encoding, public) != chain[0].public_key().public_bytes(
        encoding, public
    ):
        raise ConfigError(f"{flags[1]} does not match the certificate in {flags[0]}")
    if len(pems) > 2:
        try:
            x509.load_pem_x509_certificates(pems[2])
        except ValueError:
            raise ConfigError(f"{flags[2]}: not a PEM certificate") from None


class _TlsFiles:
    """The certificate, key and client CA, re-read when a file's mtime or size changes."""

    def __init__(self, settings: ScalerSettings, on_result: Callable[[bool], None] | None = None) -> None:
        assert settings.tls_cert_file is not None and settings.tls_key_file is not None
        self._on_result = on_result
        self.on_failure: Callable[[BaseException], None] | None = None
        """Told of a reload failure nobody foresaw (the adapter counts it as a loop failure)."""
        self._files = [
            (settings.tls_cert_file, "--external-scaler-tls-cert-file"),
            (settings.tls_key_file, "--external-scaler-tls-key-file"),
        ]
        if settings.client_ca_file is not None:
            self._files.append((settings.client_ca_file, "--external-scaler-client-ca-file"))
        self._stamp = self._stamps()
        self.initial = self._configuration()

    def _stamps(self) -> tuple[tuple[int, int], ...]:
        out = []
        for path, _flag in self._files:
            try:
                st = os.stat(path)
            except OSError:
                out.append((-1, -1))
            else:
                out.append((st.st_mtime_ns, st.st_size))
        return tuple(out)

    def _configuration(self) -> Any:
        pems = [_read_file(path, flag) for path, flag in self._files]
        _checked(pems, [f"{flag} {path}" for path, flag in self._files])
        return grpc.ssl_server_certificate_configuration(
            [(pems[1], pems[0])], root_certificates=pems[2] if len(pems) > 2 else None
        )

    def fetch(self) -> Any:
        """Called by gRPC before each handshake: a new configuration when the files changed, else None."""
        stamp = self._stamps()
        if stamp == self._stamp:
            return None
        self._stamp = stamp  # one attempt (and one line) per change, not one per handshake
        try:
            configuration = self._configuration()
        except ConfigError as exc:
            log.error(
                "external scaler: reloading the serving certificate and client CA failed, keeping the "
                "previous ones: %s",
                exc,
            )
            self._result(False)
            return None
        except Exception as exc:  # unforeseen: a handshake must not fail on it; counted
            log.error(
                "%s; keeping the previous ones",
                loops.failure_line("external scaler: reloading the serving certificate and client CA", exc),
            )
            self._result(False)
            if self.on_failure is not None:
                self.on_failure(exc)
            return None
        log.info("external scaler: serving certificate and client CA reloaded")
        self._result(True)
        return configuration

    def _result(self, ok: bool) -> None:
        if self._on_result is not None:
            self._on_result(ok)


class _Servicer(pb_grpc.ExternalScalerServicer):
    def __init__(
        self,
        *,
        scaler: Scaler,
        stats: RequestStats,
        pool: concurrent.futures.Executor,
        stream_pool: concurrent.futures.Executor,
        poll_interval: float,
        stopping: asyncio.Event,
        first_wait: float,
        max_streams: int,
        max_unary: int,
    ) -> None:
        self._scaler = scaler
        self._stats = stats
        self._pool = pool
        self._stream_pool = stream_pool
        self._poll = poll_interval
        self._stopping = stopping
        self._first_wait = first_wait
        self._max_streams = max_streams
        self._max_unary = max_unary
        self.streams = 0
        """Open StreamIsActive streams (read and written on the event loop only)."""
        self.unary = 0

    async def _run(self, fn: Callable[[], T], pool: concurrent.futures.Executor) -> T:
        token = nowait.enter()
        try:
            return fn()
        except nowait.WouldBlock:
            pass
        finally:
            nowait.leave(token)
        work = asyncio.get_running_loop().run_in_executor(pool, fn)
        try:
            return await asyncio.wait_for(work, self._first_wait)
        except TimeoutError:  # queued behind others, or Prometheus slow: the evaluation goes on
            pass
        raise UpstreamUnavailable(
            f"the first evaluation of this metric did not finish within {self._first_wait:g}s "
            "(--prometheus-timeout): Prometheus answers slowly or many new triggers arrived at once; "
            "retry shortly"
        )

    async def _unary(self, method: str, context: grpc.aio.ServicerContext, fn: Callable[[], T]) -> T:
        start = time.perf_counter()
        if self.unary >= self._max_unary:
            self._stats.record(method, "RESOURCE_EXHAUSTED", 0.0)
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"more than {self._max_unary} calls in flight at the external scaler; retry shortly",
            )
        self.unary += 1
        try:
            result = await self._run(fn, self._pool)
        except AdapterError as exc:
            code = status_code(exc)
            self._stats.record(method, code.name, time.perf_counter() - start)
            await context.abort(code, str(exc))
            raise  # abort raises; this line is for the type checker
        except Exception as exc:
            log.exception("external scaler %s failed", method)
            self._stats.record(method, "INTERNAL", time.perf_counter() - start)
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}")
            raise
        finally:
            self.unary -= 1
        self._stats.record(method, "OK", time.perf_counter() - start)
        return result

    def _reader(self, ref: Any) -> Callable[[], Reading]:
        namespace, scaler_metadata = ref.namespace, dict(ref.scalerMetadata)
        return lambda: self._scaler.read(namespace=namespace, scaler_metadata=scaler_metadata)

    async def IsActive(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        reading = await self._unary("IsActive", context, self._reader(request))
        return pb.IsActiveResponse(result=reading.active)

    async def GetMetricSpec(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        scaler_metadata = dict(request.scalerMetadata)
        trigger = await self._unary("GetMetricSpec", context, lambda: self._scaler.trigger(scaler_metadata))
        spec = pb.MetricSpec(
            metricName=trigger.metric, targetSize=int64(trigger.target), targetSizeFloat=trigger.target
        )
        return pb.GetMetricSpecResponse(metricSpecs=[spec])

    async def GetMetrics(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        reading = await self._unary("GetMetrics", context, self._reader(request.scaledObjectRef))
        value = pb.MetricValue(
            metricName=request.metricName or reading.trigger.metric,
            metricValue=int64(reading.value),
            metricValueFloat=reading.value,
        )
        return pb.GetMetricsResponse(metricValues=[value])

    async def StreamIsActive(self, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        read = self._reader(request)
        if self.streams >= self._max_streams:
            self._stats.count("StreamIsActive", "RESOURCE_EXHAUSTED")
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{self._max_streams} StreamIsActive streams are open at the external scaler, its limit",
            )
        self.streams += 1
        code = "OK"
        last: bool | None = None
        try:
            while not self._stopping.is_set():
                try:
                    reading = await self._run(read, self._stream_pool)
                except AdapterError as exc:
                    status = status_code(exc)
                    code = status.name
                    await context.abort(status, str(exc))
                except Exception as exc:
                    log.exception("external scaler StreamIsActive failed")
                    code = "INTERNAL"
                    await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}")
                if reading.active is not last:
                    last = reading.active
                    yield pb.IsActiveResponse(result=last)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), timeout=self._poll)
        except asyncio.CancelledError:
            code = "CANCELLED"  # the client went away
            raise
        finally:
            self.streams -= 1
            self._stats.count("StreamIsActive", code)


class ScalerServer:
    """Serves :class:`Scaler` on ``settings.host:settings.port`` until :meth:`stop`."""

    def __init__(
        self,
        *,
        settings: ScalerSettings,
        scaler: Scaler,
        stats: RequestStats,
        poll_interval: float,
        first_wait: float = 5.0,
        on_tls_reload: Callable[[bool], None] | None = None,
        on_tls_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.settings = settings
        self._scaler = scaler
        self._stats = stats
        self._poll = poll_interval
        self._first_wait = first_wait
        """Seconds a call waits for a first evaluation (``--prometheus-timeout``)."""
        self._tls = _TlsFiles(settings, on_tls_reload) if settings.tls_cert_file is not None else None
        if self._tls is not None:
            self._tls.on_failure = on_tls_failure
        self._pool = concurrent.futures.ThreadPoolExecutor(settings.workers, thread_name_prefix="scaler")
        self._stream_pool = concurrent.futures.ThreadPoolExecutor(
            settings.stream_workers, thread_name_prefix="scaler-stream"
        )
        self.servicer: _Servicer | None = None
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None
        self._server: grpc.aio.Server | None = None
        self._stopping: asyncio.Event | None = None
        self.port = 0

    async def _start(self) -> None:
        self._stopping = asyncio.Event()
        s = self.settings
        # gRPC's own bound only as a backstop: the servicer's limits answer first, each kind apart
        server = grpc.aio.server(
            options=server_options(s), maximum_concurrent_rpcs=s.max_streams + s.max_unary + 64
        )
        self.servicer = servicer = _Servicer(
            scaler=self._scaler,
            stats=self._stats,
            pool=self._pool,
            stream_pool=self._stream_pool,
            poll_interval=self._poll,
            stopping=self._stopping,
            first_wait=self._first_wait,
            max_streams=s.max_streams,
            max_unary=s.max_unary,
        )
        pb_grpc.add_ExternalScalerServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
        address = f"{self.settings.host}:{self.settings.port}"
        if ":" in self.settings.host:
            address = f"[{self.settings.host}]:{self.settings.port}"
        try:
            if self._tls is None:
                self.port = server.add_insecure_port(address)
            else:
                credentials = grpc.dynamic_ssl_server_credentials(
                    self._tls.initial,
                    self._tls.fetch,
                    require_client_authentication=self.settings.client_ca_file is not None,
                )
                self.port = server.add_secure_port(address, credentials)
        except RuntimeError:  # grpc: "Failed to bind to address …" (its own log line says why)
            self.port = 0
        if self.port == 0:
            raise ConfigError(
                f"cannot listen on --external-scaler-address {address}: the port is taken or the address "
                "is not local; choose a local address and a free port"
            )
        await server.start()
        self._server = server

    def start(self) -> None:
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            try:
                self._loop.run_until_complete(self._start())
            except BaseException as exc:
                failure.append(exc)
                ready.set()
                return
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="external-scaler", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._thread.join()
            self._pool.shutdown(wait=False)
            self._stream_pool.shutdown(wait=False)
            raise failure[0]
        scheme = "TLS" if self._tls is not None else "plaintext"
        log.info("KEDA external scaler (gRPC, %s) on %s:%d", scheme, self.settings.host, self.port)

    async def _stop(self, grace: float) -> None:
        assert self._stopping is not None and self._server is not None
        self._stopping.set()  # open streams end with OK at their next wait
        await self._server.stop(grace)

    def stop(self, grace: float = 2.0) -> None:
        """Ends open streams cleanly, lets calls in flight finish within ``grace`` seconds."""
        if self._thread is None or self._server is None:
            return
        future = asyncio.run_coroutine_threadsafe(self._stop(grace), self._loop)
        try:
            future.result(grace + 5.0)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5.0)
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._stream_pool.shutdown(wait=False, cancel_futures=True)
            self._thread = None
