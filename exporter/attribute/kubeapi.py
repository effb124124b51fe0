"""The exporter's only door to the Kubernetes API: a bounded list/watch of this node's ResourceSlices.

The exporter image carries no ``kubernetes`` client, and it needs one read: which UUID each DRA
device of its node has (:mod:`exporter.attribute.podresources.dra`). :class:`SliceWatcher` lists
``resource.k8s.io`` ResourceSlices with ``fieldSelector=spec.nodeName=<node>`` over HTTPS with the
ServiceAccount token (re-read before each request: bound tokens rotate), then watches from the
list's ``resourceVersion``. Every request has a socket timeout and a wall-clock deadline for the
whole answer, headers included (:mod:`gpupilot_common.watchdog`: ``timeout_s`` for a list,
``watch_s`` + 30 s for a watch), every answer a size limit (``max_bytes`` for a list, per line for a
watch); a watch ends after ``watch_s`` by the server's ``timeoutSeconds`` and is re-opened, after a
growing pause when it ended at once without an event. Whatever fails (a refused request, an answer
cut inside a chunk, an odd event) is one log line and a count (``failures``, the exporter's
``gpupilot_exporter_loop_failures_total{loop="resourceslices"}``); the last good index stays, as an
informer's cache does, and the list is retried with exponential back-off and jitter.

RBAC: ``list`` and ``watch`` on ``resourceslices`` in ``resource.k8s.io`` (deploy/ and the chart).
"""

from __future__ import annotations

import http.client
import json
import logging
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporter.attribute.podresources import dra
from exporter.errors import ExporterError
from gpupilot_common import loops, watchdog, yamlsafe

log = logging.getLogger(__name__)

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
API_VERSIONS = ("v1", "v1beta2", "v1beta1")
"""``resource.k8s.io`` versions tried in order: GA (1.34) first, then the betas of 1.32-1.33."""


class KubeApiError(ExporterError):
    """The API could not be read; ``str(e)`` is one line naming the URL and the cause."""

    temporary = True


@dataclass(frozen=True)
class ApiAccess:
    """Where the API is and how to authenticate: the in-cluster defaults, or injected by tests."""

    url: str
    """``https://HOST:PORT`` (from ``KUBERNETES_SERVICE_HOST``/``_PORT`` in a pod)."""
    token_file: Path | None = SERVICE_ACCOUNT / "token"
    ca_file: Path | None = SERVICE_ACCOUNT / "ca.crt"
    timeout_s: float = 10.0
    """Socket timeout of one request (connect and each read), in seconds."""
    max_bytes: int = 16 * 1024 * 1024
    """Largest list answer (and watch line) accepted: a node's slices are a few KiB to a few MiB."""


def in_cluster(environ: Mapping[str, str]) -> ApiAccess | None:
    """The API address a pod sees, or None outside a cluster (then canonical names are used)."""
    host, port = environ.get("KUBERNETES_SERVICE_HOST", ""), environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        return None
    if ":" in host:
        host = f"[{host}]"
    return ApiAccess(url=f"https://{host}:{port}")


class _HTTPConnection(http.client.HTTPConnection):
    def getresponse(self) -> http.client.HTTPResponse:
        watchdog.arm_current(self.sock)  # the answer ends by the caller's deadline, headers included
        return super().getresponse()


class _HTTPSConnection(http.client.HTTPSConnection):
    def getresponse(self) -> http.client.HTTPResponse:
        watchdog.arm_current(self.sock)
        return super().getresponse()


class _HTTPHandler(urllib.request.HTTPHandler):
    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_HTTPConnection, req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, context: ssl.SSLContext | None) -> None:
        super().__init__(context=context)
        self._ctx = context

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_HTTPSConnection, req, context=self._ctx)


class _Client:
    def __init__(self, access: ApiAccess) -> None:
        self.access = access
        ctx: ssl.SSLContext | None = None
        if access.url.startswith("https:"):
            ctx = ssl.create_default_context(cafile=str(access.ca_file) if access.ca_file else None)
        self._opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), _HTTPHandler(), _HTTPSHandler(ctx)
        )

    def open(self, path: str, *, timeout: float) -> Any:
        req = urllib.request.Request(self.access.url + path, headers={"Accept": "application/json"})
        if self.access.token_file is not None:
            try:
                token = yamlsafe.read_text(self.access.token_file, max_bytes=64 << 10).strip()
            except OSError as exc:
                raise KubeApiError(
                    f"{self.access.token_file}: cannot read the ServiceAccount token: {exc}"
                ) from exc
            req.add_header("Authorization", f"Bearer {token}")
        try:
            return self._opener.open(req, timeout=timeout)
        except urllib.error.HTTPError as exc:
            try:
                body = exc.read(300).decode(errors="replace")
            except (OSError, http.client.HTTPException):
                body = ""
            hint = " (check the exporter's RBAC for resourceslices)" if exc.code in (401, 403) else ""
            raise KubeApiError(
                f"{self.access.url}{path}: HTTP {exc.code}{hint}: {' '.join(body.split())}"
            ) from exc
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            raise KubeApiError(f"{self.access.url}{path}: {_why(exc, timeout)}") from exc

    def read_json(self, path: str) -> Any:
        timeout = self.access.timeout_s
        with watchdog.within(timeout):
            try:
                with self.open(path, timeout=timeout) as resp:
                    data = resp.read(self.access.max_bytes + 1)
            except (OSError, http.client.HTTPException) as exc:  # cut inside a chunk, or at the deadline
                raise KubeApiError(f"{self.access.url}{path}: {_why(exc, timeout)}") from exc
        if len(data) > self.access.max_bytes:
            raise KubeApiError(f"{self.access.url}{path}: answer exceeds {self.access.max_bytes} bytes")
        try:
            return json.loads(data)
        except ValueError as exc:
            raise KubeApiError(f"{self.access.url}{path}: answer is not JSON ({exc})") from exc


def _why(exc: BaseException, timeout: float) -> str:
    """The cause in a few words; a read the watchdog ended is named as the deadline it was."""
    if watchdog.passed():
        return f"no complete answer within {timeout:g}s"
    reason = getattr(exc, "reason", None)
    return str(reason) if reason is not None else f"{type(exc).__name__}: {exc}"


class SliceWatcher:
    """Keeps this node's ResourceSlices of one driver, by name; :meth:`current` is what the
    pod-resources client asks (a :data:`exporter.attribute.podresources.client.SliceSource`)."""

    def __init__(
        self,
        access: ApiAccess,
        *,
        node: str,
        driver: str = dra.NVIDIA_DRIVER,
        watch_s: int = 300,
        backoff_max_s: float = 60.0,
        sleep: Callable[[float], None] | None = None,
        failures: loops.LoopFailures | None = None,
    ) -> None:
        self.node = node
        self.driver = driver
        self.watch_s = watch_s
        self.backoff_max_s = backoff_max_s
        self._client = _Client(access)
        self._lock = threading.Lock()
        self._slices: dict[str, Mapping[str, Any]] | None = None
        self._index: dra.SliceIndex | None = None
        self._note = "ResourceSlices not listed yet"
        self._version: str | None = None
        self._stop = threading.Event()
        self._sleep = sleep or self._stop.wait
        self._thread: threading.Thread | None = None
        self.lists = 0
        """Successful lists so far (a relist follows every failure)."""
        self.watches = 0
        """Watches opened so far."""
        self.failures = failures or loops.LoopFailures()
        """Failures of the loop (counted under ``resourceslices``), its self-metric."""
        self.events = 0

    # -- what the exporter reads ------------------------------------------------------------------
    def current(self) -> tuple[dra.SliceIndex | None, str]:
        with self._lock:
            return self._index, self._note

    # -- one step each; the loop below strings them together ------------------------------------------
    def _collection(self) -> str:
        version = self._version or API_VERSIONS[0]
        return f"/apis/resource.k8s.io/{version}/resourceslices"

    def _query(self, **extra: str) -> str:
        params = {"fieldSelector": f"spec.nodeName={self.node}", **extra}
        return "?" + urllib.parse.urlencode(params)

    def list_once(self) -> str:
        """List the node's slices, replacing the index; returns the list's resourceVersion."""
        last: KubeApiError | None = None
        for version in [self._version] if self._version else API_VERSIONS:
            self._version = version
            try:
                doc = self._client.read_json(self._collection() + self._query())
            except KubeApiError as exc:
                last = exc
                if "HTTP 404" in str(exc):
                    self._version = None
                    continue
                raise
            if not isinstance(doc, Mapping) or not isinstance(doc.get("items"), list):
                raise KubeApiError(f"{self._collection()}: the answer has no items list")
            items = {self._name(i): i for i in doc["items"] if isinstance(i, Mapping)}
            self._replace(items, "")
            self.lists += 1
            meta = doc.get("metadata")
            return str(meta.get("resourceVersion", "")) if isinstance(meta, Mapping) else ""
        raise last or KubeApiError("resource.k8s.io: no ResourceSlice API version answered")

    def watch_once(self, resource_version: str) -> str:
        """Follow changes until the server ends the watch; returns the last resourceVersion seen.
        Raises :class:`KubeApiError` on a broken stream or an ERROR event (e.g. 410 Gone)."""
        query = self._query(watch="true", resourceVersion=resource_version, timeoutSeconds=str(self.watch_s))
        with watchdog.within(self.watch_s + 30):
            self.watches += 1
            with self._client.open(self._collection() + query, timeout=self.watch_s + 30) as resp:
                return self._follow(resp, resource_version)

    def _follow(self, resp: Any, resource_version: str) -> str:
        limit = self._client.access.max_bytes
        while not self._stop.is_set():
            try:
                line = resp.readline(limit + 1)
            except (OSError, http.client.HTTPException) as exc:  # IncompleteRead: a cut chunk
                raise KubeApiError(
                    f"{self._collection()}: watch broke: {_why(exc, self.watch_s + 30)}"
                ) from exc
            if not line:
                return resource_version
            if len(line) > limit:
                raise KubeApiError(f"{self._collection()}: watch event exceeds {limit} bytes")
            if not line.strip():
                continue
            event = json.loads(line)
            obj = event.get("object") if isinstance(event, Mapping) else None
            if not isinstance(obj, Mapping):
                raise KubeApiError(f"{self._collection()}: watch event without an object: {line[:200]!r}")
            kind = event.get("type")
            if kind == "ERROR":
                raise KubeApiError(f"{self._collection()}: watch ended: {obj.get('message', obj)}")
            meta = obj.get("metadata")
            if isinstance(meta, Mapping):
                resource_version = str(meta.get("resourceVersion", resource_version))
            self.events += 1
            if kind == "BOOKMARK":
                continue
            with self._lock:
                items = dict(self._slices or {})
            if kind == "DELETED":
                items.pop(self._name(obj), None)
            elif kind in ("ADDED", "MODIFIED"):
                items[self._name(obj)] = obj
            self._replace(items, "")
        return resource_version

    # -- the loop ---------------------------------------------------------------------------------
    def start(self) -> SliceWatcher:
        self._thread = threading.Thread(target=self._loop, name="resourceslices", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _loop(self) -> None:
        pause = loops.Backoff(initial_s=1.0, max_s=self.backoff_max_s)
        while not self._stop.is_set():
            if loops.guarded(
                "ResourceSlices list/watch", self._list_and_watch, logger=log, on_failure=self._failed
            ):
                pause.reset()
            else:
                self._sleep(pause.next_delay())

    def _list_and_watch(self) -> None:
        """One list, then watches until one fails (raises) or the watcher stops."""
        version = self.list_once()
        quiet = loops.Backoff(initial_s=0.5, max_s=self.backoff_max_s)
        while not self._stop.is_set():
            started, events = time.monotonic(), self.events
            version = self.watch_once(version)
            wait = loops.watch_pause(
                lasted_s=time.monotonic() - started, events=self.events - events, backoff=quiet
            )
            if wait:  # ended at once without an event: not reopened at once
                self._sleep(wait)

    def _failed(self, exc: BaseException) -> None:
        """The index stays as it was (the last good list and events); the note says why it may be
        stale; the failure is counted."""
        self.failures.add("resourceslices")
        with self._lock:
            self._note = loops.failure_line("ResourceSlices", exc)

    def mark_unavailable(self, message: str) -> None:
        """Drop the index: DRA devices fall back to canonical names until the next good list."""
        self._replace(None, message)

    def _replace(self, items: dict[str, Mapping[str, Any]] | None, note: str) -> None:
        index = None if items is None else dra.slice_index(items.values(), driver=self.driver)
        with self._lock:
            self._slices, self._index, self._note = items, index, note

    @staticmethod
    def _name(obj: Mapping[str, Any]) -> str:
        meta = obj.get("metadata")
        return str(meta.get("name", "")) if isinstance(meta, Mapping) else ""
