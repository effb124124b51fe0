"""The renderings ``make e2e`` runs: the chart and the kustomize overlays, and their workloads."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "gpupilot"
OVERLAYS = ("gpu-operator", "openshift")
# The chart as installed with auto-apply on and every optional serving path the checks reach.
CHART_SETTINGS = (
    "rightsizer.autoApply.enabled=true",
    "adapter.externalMetrics=true",
    "adapter.externalScaler.enabled=true",
)
# The overlays with the same optional serving paths (kustomize components).
OVERLAY_COMPONENTS = ("adapter/external", "adapter/keda")
SA_CA = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
SERVICE_CA = "/var/run/secrets/kubernetes.io/serviceaccount/service-ca.crt"
"""OpenShift's service CA, which only OpenShift mounts beside the token: the cluster CA stands in."""
# More installs users make, each: (values files, --set lines). "chart-openshift": the file OpenShift
# users start from, its Prometheus being the e2e's (plain HTTP: the pod's token is sent, the cluster CA
# stands in for the service CA, which only OpenShift mounts; no SecurityContextConstraints kind here).
# "chart-scaler-only": KEDA's external scaler beside a prometheus-adapter that keeps both metrics APIs.
# "chart-two-releases": a second release beside the default one (installed first): its own prefix,
# the APIServices and the cluster's rules and dashboards left to the first.
CHART_VARIANTS: dict[str, tuple[tuple[Path, ...], tuple[str, ...]]] = {
    "chart-openshift": ((CHART / "values-openshift.yaml",), (f"prometheusAuth.caFile={SA_CA}", "exporter.openshiftScc=false")),
    "chart-scaler-only": ((), ("adapter.customMetrics=false", "adapter.externalMetrics=false", "adapter.externalScaler.enabled=true")),
    "chart-two-releases": ((), ("fullnameOverride=gpupilot-b", "adapter.customMetrics=false", "adapter.externalMetrics=false",
                                "monitoring.prometheusRules.enabled=false", "monitoring.dashboards.enabled=false")),
}  # fmt: skip
SECOND_RELEASE = "gpupilot-b"
_IMAGE = re.compile(r"gpupilot-(exporter|adapter|rightsizer)[:@]")

Obj = dict[str, Any]


class RenderError(RuntimeError):
    pass


@dataclass(frozen=True)
class Workload:
    """One pod as rendered: a DaemonSet's or Deployment's template, or a Pod (the `helm test` hook)."""

    kind: str
    name: str
    namespace: str
    spec: Obj
    metadata: Obj

    @property
    def container(self) -> Obj:
        (only,) = self.spec["containers"]
        return only  # type: ignore[no-any-return]

    @property
    def service(self) -> str:
        found = _IMAGE.search(self.container["image"])
        if found is None:
            raise RenderError(
                f"{self.kind}/{self.name}: image {self.container['image']} is none of gpupilot's"
            )
        return found.group(1)


@dataclass
class Rendering:
    name: str
    objects: list[Obj]
    notes: list[str] = field(default_factory=list)
    release: str = "gpupilot"
    """The Helm release it is installed as (a chart rendering)."""
    values: tuple[Path, ...] = ()
    settings: tuple[str, ...] = ()
    """The values files and --set lines it was rendered with (a chart rendering), prometheus.url aside."""

    def find(self, kind: str, name: str) -> Obj | None:
        return next((o for o in self.objects if o["kind"] == kind and o["metadata"]["name"] == name), None)

    def of_kind(self, kind: str) -> list[Obj]:
        return [o for o in self.objects if o["kind"] == kind]

    def workloads(self) -> list[Workload]:
        out = []
        for obj in self.objects:
            meta = obj["metadata"]
            if obj["kind"] in ("DaemonSet", "Deployment"):
                template = obj["spec"]["template"]
                out.append(
                    Workload(
                        obj["kind"],
                        meta["name"],
                        meta["namespace"],
                        template["spec"],
                        template.get("metadata", {}),
                    )
                )
            elif obj["kind"] == "Pod":
                out.append(Workload("Pod", meta["name"], meta["namespace"], obj["spec"], meta))
        return out

    def workload(self, service: str, kind: str = "") -> Workload:
        for w in self.workloads():
            if w.service == service and (not kind or w.kind == kind):
                return w
        raise RenderError(f"{self.name}: no {kind or 'workload'} of the {service} image rendered")


def _tool(name: str) -> str:
    here = Path(sys.executable).parent / name
    found = str(here) if os.access(here, os.X_OK) else shutil.which(name)
    if not found:
        raise RenderError(f"{name} not found: run 'make {name}'")
    return found


def _run(cmd: list[str]) -> list[Obj]:
    res = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=180)
    if res.returncode != 0:
        last = (res.stderr.strip().splitlines() or ["no output"])[-1]
        raise RenderError(f"{' '.join(cmd[:2])}: {last}")
    return [d for d in yaml.safe_load_all(res.stdout) if d]


def chart(prometheus_url: str) -> Rendering:
    cmd = [_tool("helm"), "template", "gpupilot", str(CHART), "--namespace", "gpupilot"]
    settings = (*CHART_SETTINGS, f"prometheus.url={prometheus_url}")
    for s in settings:
        cmd += ["--set", s]
    rendering = Rendering("chart", _run(cmd))
    rendering.notes.append("helm template --set " + ",".join(settings))
    return rendering


def chart_variant(name: str, prometheus_url: str) -> Rendering:
    """One of :data:`CHART_VARIANTS`, rendered as ``helm install`` will install it."""
    values, settings = CHART_VARIANTS[name]
    release = SECOND_RELEASE if name == "chart-two-releases" else "gpupilot"
    cmd = [_tool("helm"), "template", release, str(CHART), "--namespace", "gpupilot"]
    for v in values:
        cmd += ["-f", str(v)]
    for s in (*settings, f"prometheus.url={prometheus_url}"):
        cmd += ["--set", s]
    rendering = Rendering(name, _run(cmd), release=release, values=values, settings=settings)
    rendering.notes.append(
        f"helm template {release}" + "".join(f" -f {v.name}" for v in values) + " --set " + ",".join(settings)
    )
    return rendering


def clashes(first: list[Obj], second: list[Obj]) -> list[str]:
    """Objects two releases would both own (kind, namespace, name), and pod selectors both would match:
    a second release must have none."""

    def key(o: Obj) -> tuple[str, str, str]:
        return (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"])

    names = {key(o) for o in first} & {key(o) for o in second}
    selectors = {
        (o["metadata"].get("namespace", ""), tuple(sorted(o["spec"]["selector"]["matchLabels"].items())))
        for o in first
        if o["kind"] in ("Deployment", "DaemonSet")
    }
    shared = [
        f"{o['kind']}/{o['metadata']['name']} selects the first release's pods"
        for o in second
        if o["kind"] in ("Deployment", "DaemonSet")
        and (o["metadata"].get("namespace", ""), tuple(sorted(o["spec"]["selector"]["matchLabels"].items())))
        in selectors
    ]
    return [f"{k}/{ns or '-'}/{n} in both" for k, ns, n in sorted(names)] + shared


def overlay(name: str, prometheus_url: str, work: Path) -> Rendering:
    """The overlay with the external-metrics and KEDA components; its Prometheus URL (an in-cluster
    name) replaced by the e2e Prometheus where docs/deploy.md says to change it (the adapter's
    --prometheus-url and the rightsizer's prometheus_url)."""
    top = work / f"kustomize-{name}"
    top.mkdir(parents=True, exist_ok=True)
    deploy = ROOT / "deploy"
    doc = {
        "resources": [os.path.relpath(deploy / "overlays" / name, top)],
        "components": [os.path.relpath(deploy / c, top) for c in OVERLAY_COMPONENTS],
    }
    (top / "kustomization.yaml").write_text(yaml.safe_dump(doc))
    objs = _run([_tool("kubectl"), "kustomize", str(top)])
    rendering = Rendering(f"overlays/{name}", objs)
    args = rendering.workload("adapter", "Deployment").container["args"]
    (old,) = [a.split("=", 1)[1] for a in args if a.startswith("--prometheus-url=")]
    text = yaml.safe_dump_all(objs, sort_keys=False).replace(old, prometheus_url)
    rendering.notes.append(
        f"kubectl kustomize + components {', '.join(OVERLAY_COMPONENTS)}; Prometheus URL {old} -> {prometheus_url}"
    )
    if SERVICE_CA in text:
        text = text.replace(SERVICE_CA, SA_CA)
        rendering.notes.append(
            "OpenShift's service CA file -> the cluster CA (only OpenShift mounts the former)"
        )
    rendering.objects = [d for d in yaml.safe_load_all(text) if d]
    return rendering


MONITORING_VALUES = {
    "ServiceMonitor": (
        "exporter.serviceMonitor.enabled",
        "adapter.serviceMonitor.enabled",
        "rightsizer.serviceMonitor.enabled",
    ),
    "PodMonitor": ("exporter.podMonitor.enabled",),
    "PrometheusRule": ("monitoring.prometheusRules.enabled",),
    "SecurityContextConstraints": ("exporter.openshiftScc",),
}
"""The chart's switches for the prometheus-operator's kinds: off where a cluster has not their CRDs."""


def monitoring_switches(missing: set[str]) -> list[str]:
    """The chart values that leave out the kinds in ``missing`` (``helm install`` refuses kinds it
    cannot map); any other missing kind is an error naming it."""
    unknown = missing - set(MONITORING_VALUES)
    if unknown:
        raise RenderError(
            f"the chart renders kinds this cluster does not serve: {', '.join(sorted(unknown))}"
        )
    return [key for kind in sorted(missing) for key in MONITORING_VALUES[kind]]
