"""The series an autoscaled service publishes over a time window: its pods (kube-state-metrics and
the inference server's own), its Deployment and its HPA.

Pods come and go with the HPA's decisions, so unlike :func:`simulator.cluster.series` the list
depends on the window: :func:`window_series` returns the pods alive at some moment of it, each
series NaN outside its pod's life (the backfill writes no sample there; the live endpoint leaves it
out). The inference server's series exist while the pod is Ready.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from exporter.expose.exposition import LabelPairs
from simulator import identity, service
from simulator.cluster import Series, ksm_label
from simulator.model import Scenario, Service
from simulator.patterns import Array
from simulator.service import IntArray, PodLife, Week

_PHASES = ("Pending", "Running", "Succeeded", "Failed", "Unknown")
WeekFn = Callable[[Week, IntArray], Array]


def window_series(scenario: Scenario, t0: float, t1: float) -> list[Series]:
    """Every service's series with a sample in ``[t0, t1]``."""
    out: list[Series] = []
    for svc in scenario.services:
        out.extend(_service(scenario.seed, svc))
        for start in service.weeks_between(t0 - service.SYNC_S, t1):
            wk = service.week(svc, scenario.seed, start)
            for pod in wk.pods:
                if pod.created <= t1 and pod.deleted > t0 - service.SYNC_S:
                    out.extend(_pod(scenario.seed, svc, wk, pod))
    return out


def warm(scenario: Scenario, t: float, *, ahead: float = 3600.0) -> None:
    """Run (and cache) every service's week holding ``t``, and the next one when it starts within
    ``ahead``: a live endpoint calls this off its scrape path, so no scrape waits for a week's run."""
    for svc in scenario.services:
        for start in service.weeks_between(t, t + ahead):
            service.week(svc, scenario.seed, start)


def values_at(svc: Service, seed: int, ts: Array, fn: WeekFn) -> Array:
    """``fn(week, step indices)`` at each time, whatever week it falls in."""
    out = np.full(len(ts), math.nan)
    starts = service.MONDAY_ORIGIN + np.floor((ts - service.MONDAY_ORIGIN) / service.WEEK_S) * service.WEEK_S
    for start in np.unique(starts):
        mask = starts == start
        wk = service.week(svc, seed, float(start))
        out[mask] = fn(wk, wk.index(ts[mask]))
    return out


def _service(seed: int, svc: Service) -> list[Series]:
    ns, name = svc.namespace, svc.deployment
    rs = identity.replicaset_name(seed, ns, name)
    dep: LabelPairs = (("namespace", ns), ("deployment", name))

    def spec(ts: Array) -> Array:
        return values_at(svc, seed, ts, lambda w, i: w.spec[i].astype(np.float64))

    def ready(ts: Array) -> Array:
        return values_at(svc, seed, ts, lambda w, i: w.ready[i].astype(np.float64))

    hpa_base: LabelPairs = (("namespace", ns), ("horizontalpodautoscaler", svc.hpa_name))
    out = [
        Series(
            "kube_deployment_spec_replicas", "gauge", "Number of desired pods for a deployment.", dep, spec
        ),
        Series(
            "kube_deployment_status_replicas_available",
            "gauge",
            "The number of available replicas per deployment.",
            dep,
            ready,
        ),
        Series(
            "kube_replicaset_owner",
            "gauge",
            "Information about the ReplicaSet's owner.",
            (
                ("namespace", ns),
                ("replicaset", rs),
                ("owner_kind", "Deployment"),
                ("owner_name", name),
                ("owner_is_controller", "true"),
            ),
            1.0,
        ),
        Series(
            "kube_horizontalpodautoscaler_info",
            "gauge",
            "Information about this autoscaler.",
            (
                *hpa_base,
                ("scaletargetref_api_version", "apps/v1"),
                ("scaletargetref_kind", "Deployment"),
                ("scaletargetref_name", name),
            ),
            1.0,
        ),
        Series(
            "kube_horizontalpodautoscaler_spec_min_replicas",
            "gauge",
            "Lower limit for the number of pods that can be set by the autoscaler, default 1.",
            hpa_base,
            float(svc.hpa.min_replicas),
        ),
        Series(
            "kube_horizontalpodautoscaler_spec_max_replicas",
            "gauge",
            "Upper limit for the number of pods that can be set by the autoscaler; cannot be smaller than MinReplicas.",
            hpa_base,
            float(svc.hpa.max_replicas),
        ),
        Series(
            "kube_horizontalpodautoscaler_status_current_replicas",
            "gauge",
            "Current number of replicas of pods managed by this autoscaler.",
            hpa_base,
            spec,
        ),
        Series(
            "kube_horizontalpodautoscaler_status_desired_replicas",
            "gauge",
            "Desired number of replicas of pods managed by this autoscaler.",
            hpa_base,
            spec,
        ),
    ]
    for m in svc.hpa.metrics:
        out.append(
            Series(
                "kube_horizontalpodautoscaler_spec_target_metric",
                "gauge",
                "The metric specifications used by this autoscaler when calculating the desired replica count.",
                (*hpa_base, ("metric_name", m.name), ("metric_target_type", "average")),
                m.target,
            )
        )
    return out


def _pod(seed: int, svc: Service, wk: Week, pod: PodLife) -> list[Series]:
    ns = svc.namespace
    rs = identity.replicaset_name(seed, ns, svc.deployment)
    uid = identity.pod_uid(seed, ns, pod.name)
    base: LabelPairs = (("namespace", ns), ("pod", pod.name), ("uid", uid))
    own: LabelPairs = (("namespace", ns), ("pod", pod.name))
    first_ready = max(0, math.ceil((pod.ready_at - wk.start) / service.SYNC_S - 1e-9))

    def alive_mask(i: IntArray) -> npt.NDArray[np.bool_]:
        at = wk.start + i * service.SYNC_S
        return (i >= 0) & (pod.created <= at + 1e-6) & (at < pod.deleted - 1e-6)

    def ready_mask(i: IntArray) -> npt.NDArray[np.bool_]:
        return alive_mask(i) & (wk.start + i * service.SYNC_S >= pod.ready_at - 1e-6)

    def when_alive(value: float) -> Callable[[Array], Array]:
        def fn(ts: Array) -> Array:
            i = wk.index(ts)
            return np.where(alive_mask(i), value, math.nan)

        return fn

    def ready_flag(want: bool) -> Callable[[Array], Array]:
        def fn(ts: Array) -> Array:
            i = wk.index(ts)
            r = ready_mask(i)
            return np.where(alive_mask(i), np.where(r == want, 1.0, 0.0), math.nan)

        return fn

    def gauge(metric: str, field: Callable[[Week], Array]) -> Callable[[Array], Array]:
        def fn(ts: Array) -> Array:
            i = wk.index(ts)
            j = np.maximum(i, 0)
            value = service.pod_values(metric, field(wk)[j], wk.slot_noise[pod.slot][j])
            return np.where(ready_mask(i), value, math.nan)

        return fn

    def counter(cumulative: Array, rate: Array) -> Callable[[Array], Array]:
        def fn(ts: Array) -> Array:
            i = wk.index(ts)
            j = np.maximum(i, 0)
            since = ts - (wk.start + j * service.SYNC_S)
            value = cumulative[j] - cumulative[first_ready] + rate[j] * since
            return np.where(ready_mask(i), np.round(value, 3), math.nan)

        return fn

    info = (
        *base,
        ("node", svc.node),
        ("created_by_kind", "ReplicaSet"),
        ("created_by_name", rs),
        ("priority_class", ""),
        ("host_network", "false"),
    )
    labels = (*base, *sorted((ksm_label(k), v) for k, v in svc.labels))
    owner = (*base, ("owner_kind", "ReplicaSet"), ("owner_name", rs), ("owner_is_controller", "true"))
    out = [
        Series("kube_pod_info", "gauge", "Information about pod.", info, when_alive(1.0)),
        Series(
            "kube_pod_labels",
            "gauge",
            "Kubernetes labels converted to Prometheus labels.",
            labels,
            when_alive(1.0),
        ),
        Series("kube_pod_owner", "gauge", "Information about the Pod's owner.", owner, when_alive(1.0)),
        Series(
            "kube_pod_container_info",
            "gauge",
            "Information about a container in a pod.",
            (*base, ("container", svc.container)),
            when_alive(1.0),
        ),
    ]
    out += [
        Series(
            "kube_pod_status_phase",
            "gauge",
            "The pods current phase.",
            (*base, ("phase", phase)),
            when_alive(1.0 if phase == "Running" else 0.0),
        )
        for phase in _PHASES
    ]
    out += [
        Series(
            "kube_pod_status_ready",
            "gauge",
            "Describes whether the pod is ready to serve requests.",
            (*base, ("condition", cond)),
            ready_flag(cond == "true"),
        )
        for cond in ("true", "false")
    ]
    out += [
        Series(
            "inference_queue_depth",
            "gauge",
            "Requests waiting in the inference server's queue (simulated).",
            own,
            gauge("inference_queue_depth", lambda w: w.queue),
        ),
        Series(
            "inference_kv_cache_usage_ratio",
            "gauge",
            "Share of the KV cache in use, 0-1 (simulated).",
            own,
            gauge("inference_kv_cache_usage_ratio", lambda w: w.kv),
        ),
        Series(
            "inference_queue_wait_seconds",
            "gauge",
            "Time requests waited in the queue before being served, quantiles over the last minute (simulated).",
            (*own, ("quantile", "0.5")),
            gauge("inference_queue_wait_seconds", lambda w: w.wait_p50),
        ),
        Series(
            "inference_queue_wait_seconds",
            "gauge",
            "Time requests waited in the queue before being served, quantiles over the last minute (simulated).",
            (*own, ("quantile", "0.95")),
            gauge("inference_queue_wait_seconds", lambda w: w.wait_p95),
        ),
        Series(
            "inference_requests_total",
            "counter",
            "Requests the pod served (simulated).",
            own,
            counter(wk.served_cumulative, wk.served),
        ),
        Series(
            "inference_requests_rejected_total",
            "counter",
            "Requests the pod turned away with its queue full (simulated).",
            own,
            counter(wk.rejected_cumulative, wk.rejected),
        ),
    ]
    return out
