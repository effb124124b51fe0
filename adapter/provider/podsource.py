"""Label selector → pods, from one of two sources:

* ``KubernetesPodSource`` — an in-memory index kept fresh by a pods list+watch (``adapter.clients.kube``);
  a request reads the index, never the API server.
* ``PrometheusPodSource`` — kube-state-metrics' ``kube_pod_labels`` and ``kube_pod_status_phase``
  in Prometheus (``--pod-source prometheus``), for clusters where the adapter should not watch pods,
  and for the demo and tests on one machine. A namespace's pods are fetched with one query each for
  labels and phase and cached for ``ttl`` seconds; the selector is matched in process.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import Gauge

from adapter.clients.kube import KubeClient, PodRecord
from adapter.clients.prometheus import PrometheusClient
from adapter.errors import UpstreamUnavailable
from adapter.provider import nowait
from adapter.provider.selectors import Selector, prometheus_label_name, promql_escape
from gpupilot_common import loops

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Pod:
    name: str
    labels: Mapping[str, str]
    ready: bool
    """Running and Ready (Kubernetes source) or Running (Prometheus source)."""
    phase: str


class PodSource(Protocol):
    def select(self, namespace: str, selector: Selector) -> list[Pod]:
        """Pods of ``namespace`` whose labels match ``selector`` (terminating pods left out)."""
        ...

    def synced(self) -> bool:
        """True once the source can answer (first list done)."""
        ...

    def namespace_size(self, namespace: str) -> int:
        """How many pods the namespace holds (to decide whether naming pods in the query pays)."""
        ...

    def close(self) -> None: ...


class KubernetesPodSource:
    def __init__(
        self,
        kube: KubeClient,
        *,
        age_gauge: Gauge | None = None,
        after_reset: Callable[[], None] | None = None,
        on_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        self._on_failure = on_failure
        self._kube = kube
        self._after_reset = after_reset
        """Called once a full list is in place (the app freezes the heap: see ``adapter.serving.app``)."""
        self._lock = threading.Lock()
        self._by_ns: dict[str, dict[str, PodRecord]] = {}
        self._generation: dict[str, int] = {}
        self._memo = _SelectionMemo()
        self._synced = threading.Event()
        self._listed = False
        """Set with ``_synced``, read by every request."""
        self._stop = threading.Event()
        self._last_event = 0.0
        if age_gauge is not None:
            age_gauge.set_function(lambda: time.monotonic() - self._last_event if self._last_event else -1)
        self._thread = threading.Thread(target=self._run, name="pod-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        # watch_pods relists and re-watches after the failures it knows; anything else (a pod it
        # cannot read, a bug) ends it: one line, counted, the index kept, and it starts again
        loops.keep_running(
            "pod watch",
            lambda: self._kube.watch_pods(on_reset=self._reset, on_event=self._event, stop=self._stop),
            stop=self._stop,
            interval=lambda: 0.0,
            logger=log,
            on_failure=self._on_failure,
            backoff=loops.Backoff(initial_s=0.5, max_s=30.0),
        )

    def _reset(self, pods: list[PodRecord]) -> None:
        index: dict[str, dict[str, PodRecord]] = {}
        for pod in pods:
            index.setdefault(pod.namespace, {})[pod.name] = pod
        with self._lock:
            self._by_ns = index
            self._generation = {
                ns: self._generation.get(ns, 0) + 1 for ns in set(index) | set(self._generation)
            }
            self._last_event = time.monotonic()
        if self._after_reset is not None:
            self._after_reset()
        self._listed = True
        self._synced.set()

    def _event(self, kind: str, pod: PodRecord) -> None:
        with self._lock:
            bucket = self._by_ns.setdefault(pod.namespace, {})
            if kind == "DELETED":
                bucket.pop(pod.name, None)
            else:
                bucket[pod.name] = pod
            self._generation[pod.namespace] = self._generation.get(pod.namespace, 0) + 1
            self._last_event = time.monotonic()

    def wait_synced(self, timeout: float) -> bool:
        return self._synced.wait(timeout)

    def synced(self) -> bool:
        return self._synced.is_set()

    def namespace_size(self, namespace: str) -> int:
        with self._lock:
            return len(self._by_ns.get(namespace, {}))

    def select(self, namespace: str, selector: Selector) -> list[Pod]:
        if not self._listed:  # a plain flag: Event.is_set() is a Python call on every request
            raise UpstreamUnavailable("the pod watch has not completed its first list yet; retry shortly")
        with self._lock:
            generation = self._generation.get(namespace, 0)
            hit = self._memo.get(namespace, selector, generation)
            if hit is not None:
                return hit
            nowait.check()  # matching a namespace's pods: milliseconds, once per pod change
            records = list(self._by_ns.get(namespace, {}).values())
        picked = [
            Pod(r.name, r.labels, r.ready and r.phase == "Running", r.phase)
            for r in records
            if not r.deleting and r.phase not in ("Succeeded", "Failed") and selector.matches(r.labels)
        ]
        with self._lock:
            self._memo.put(namespace, selector, generation, picked)
        return picked

    def close(self) -> None:
        self._stop.set()


@dataclass(frozen=True)
class _NamespacePods:
    fetched: float
    pods: tuple[Pod, ...]
    serial: int
    """Distinct for every fetch: the selection memo's validity stamp."""


class PrometheusPodSource:
    def __init__(self, prometheus: PrometheusClient, *, ttl: float = 15.0) -> None:
        self._prometheus = prometheus
        self._ttl = ttl
        self._cache: dict[str, _NamespacePods] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self._refreshing: set[str] = set()
        self._memo = _SelectionMemo()
        self._serial = 0

    def synced(self) -> bool:
        return True

    def _namespace_lock(self, namespace: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(namespace, threading.Lock())

    def _fetch(self, namespace: str) -> _NamespacePods:
        ns = promql_escape(namespace)
        label_rows = self._prometheus.query(f'kube_pod_labels{{namespace="{ns}"}}', purpose="pods")
        phases = self._prometheus.query(f'kube_pod_status_phase{{namespace="{ns}"}} == 1', purpose="pods")
        phase_of = {s.labels.get("pod", ""): s.labels.get("phase", "") for s in phases}
        pods: dict[str, Pod] = {}
        for row in label_rows:
            name = row.labels.get("pod", "")
            if not name or name in pods:
                continue
            pod_labels = {k[len("label_") :]: v for k, v in row.labels.items() if k.startswith("label_")}
            phase = phase_of.get(name, "Unknown")
            pods[name] = Pod(name, pod_labels, phase == "Running", phase)
        with self._guard:
            self._serial += 1
            serial = self._serial
        return _NamespacePods(time.monotonic(), tuple(pods.values()), serial)

    def _refresh(self, namespace: str) -> _NamespacePods:
        with self._namespace_lock(namespace):
            cached = self._cache.get(namespace)
            if cached is not None and time.monotonic() - cached.fetched < self._ttl:
                return cached
            fresh = self._fetch(namespace)
            self._cache[namespace] = fresh
            return fresh

    def _refresh_quietly(self, namespace: str) -> None:
        try:
            self._refresh(namespace)
        except UpstreamUnavailable as exc:
            log.warning("refreshing pods of namespace %s failed: %s", namespace, exc)
        finally:
            with self._guard:
                self._refreshing.discard(namespace)

    def _pods(self, namespace: str) -> _NamespacePods:
        """Cached listing; past ``ttl`` it is refreshed in the background while the cached one is
        served (up to ``3 × ttl``, then the request waits), so no request pays for the refresh."""
        cached = self._cache.get(namespace)
        age = time.monotonic() - cached.fetched if cached is not None else None
        if cached is not None and age is not None and age < self._ttl:
            return cached
        if cached is not None and age is not None and age < 3 * self._ttl:
            with self._guard:
                start = namespace not in self._refreshing
                self._refreshing.add(namespace)
            if start:
                threading.Thread(target=self._refresh_quietly, args=(namespace,), daemon=True).start()
            return cached
        nowait.check()  # the request would wait for the listing
        return self._refresh(namespace)

    def namespace_size(self, namespace: str) -> int:
        return len(self._pods(namespace).pods)

    def select(self, namespace: str, selector: Selector) -> list[Pod]:
        entry = self._pods(namespace)
        with self._guard:
            hit = self._memo.get(namespace, selector, entry.serial)
        if hit is not None:
            return hit
        nowait.check()
        sanitised = sanitise(selector)
        picked = [
            p for p in entry.pods if p.phase not in ("Succeeded", "Failed") and sanitised.matches(p.labels)
        ]
        with self._guard:
            self._memo.put(namespace, selector, entry.serial, picked)
        return picked

    def oldest_age(self) -> float:
        if not self._cache:
            return -1.0
        now = time.monotonic()
        return max(now - c.fetched for c in self._cache.values())

    def close(self) -> None:
        self._cache.clear()


def sanitise(selector: Selector) -> Selector:
    """The selector with keys as kube-state-metrics writes them (``app.kubernetes.io/name`` →
    ``app_kubernetes_io_name``), to match ``kube_pod_labels``' ``label_*`` names."""
    return Selector(tuple(r._replace(key=prometheus_label_name(r.key)) for r in selector.requirements))


class _SelectionMemo:
    """Selector results per namespace, valid while the namespace's pods are unchanged (``stamp``):
    the HPA asks the same question every 15 s, so matching runs once per change, not per request."""

    def __init__(self, limit: int = 4096) -> None:
        self._data: dict[tuple[str, Selector], tuple[int, list[Pod]]] = {}
        self._limit = limit

    def get(self, namespace: str, selector: Selector, stamp: int) -> list[Pod] | None:
        hit = self._data.get((namespace, selector))
        return hit[1] if hit is not None and hit[0] == stamp else None

    def put(self, namespace: str, selector: Selector, stamp: int, pods: list[Pod]) -> None:
        if len(self._data) >= self._limit:
            self._data.clear()
        self._data[(namespace, selector)] = (stamp, pods)
