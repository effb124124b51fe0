"""``python -m devkit.e2e`` (``make e2e``): see :mod:`devkit.e2e`."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from devkit import gobuild, process, prometheus
from devkit.cluster.kubeclient import KubeError
from devkit.e2e import certmanager, checks, cluster, render
from devkit.e2e.pod import ARCHIVES, PodError, PodRun, archive
from devkit.e2e.render import ROOT, Obj, Rendering, Workload

SCENARIO = ROOT / "examples" / "fleet-demo.yaml"
SIM_NODE = "gpu-h100-a"
SERVICES = ("exporter", "adapter", "rightsizer")
RELEASES = {gobuild.KUBERNETES_RELEASE: "kube", gobuild.KUBERNETES_OLDEST: "kube-1.34"}
"""Kubernetes releases the e2e runs on → the devkit.gobuild tool that builds them."""
ERRORS = (
    checks.CheckFailed,
    PodError,
    render.RenderError,
    certmanager.CertManagerError,
    cluster.InstallError,
    KubeError,
    OSError,
    ValueError,
)


@dataclass
class Result:
    rendering: str
    check: str
    ok: bool
    line: str


class Run:
    def __init__(self, work: Path, *, keep: bool = False, kube_tool: str = "kube") -> None:
        self.work = work
        self.keep = keep
        self.kube_tool = kube_tool
        self.results: list[Result] = []
        self.started = time.monotonic()

    def check(self, rendering: str, name: str, fn: Callable[[], str]) -> bool:
        t0 = time.monotonic()
        try:
            line, ok = fn(), True
        except ERRORS as err:
            line, ok = (str(err).splitlines() or [type(err).__name__])[0], False
        took = time.monotonic() - t0
        self.results.append(Result(rendering, name, ok, line))
        print(f"{'PASS' if ok else 'FAIL'}  {rendering:22} {name:26} {line} ({took:.0f}s)", flush=True)
        return ok

    def note(self, text: str) -> None:
        print(f"      {text}", flush=True)


def port_free(port: int) -> bool:
    with socket.socket() as s:  # every interface, as a container's listener binds
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))  # noqa: S104 (a probe, closed at once)
        except OSError:
            return False
    return True


def ports_of(pod: PodRun) -> list[int]:
    return [int(p["containerPort"]) for p in pod.workload.container.get("ports", [])]


def map_taken_ports(pod: PodRun, run: Run) -> dict[int, int]:
    """Rendered ports this machine already uses, mapped with the workload's own flag or file."""
    mapped = {}
    for port in ports_of(pod):
        if not port_free(port):
            new = process.free_port()
            pod.replace_port(port, new)
            mapped[port] = new
            run.note(
                f"{pod.workload.name}: port {port} is taken on this machine: mapped to {new} (its flag or config)"
            )
    return mapped


def scrape_job(rendering: Rendering, port: int) -> prometheus.ScrapeJob:
    """The exporter's ServiceMonitor (else PodMonitor) as a static Prometheus job on this machine:
    its path, interval, honorLabels, the node labels its relabelings set from the pod's node, and
    its metricRelabelings."""
    monitor = rendering.find("ServiceMonitor", "gpupilot-exporter") or rendering.find(
        "PodMonitor", "gpupilot-exporter"
    )
    if monitor is None:
        raise render.RenderError(f"{rendering.name}: no ServiceMonitor or PodMonitor for the exporter")
    (endpoint,) = monitor["spec"].get("endpoints") or monitor["spec"]["podMetricsEndpoints"]
    labels = {
        r["targetLabel"]: SIM_NODE
        for r in endpoint.get("relabelings", [])
        if r.get("sourceLabels") == ["__meta_kubernetes_pod_node_name"]
    }
    keys = {
        "sourceLabels": "source_labels",
        "targetLabel": "target_label",
        "regex": "regex",
        "action": "action",
        "replacement": "replacement",
    }
    metric_relabel = [
        {keys[k]: v for k, v in r.items() if k in keys} for r in endpoint.get("metricRelabelings", [])
    ]
    return prometheus.ScrapeJob(
        "gpupilot-exporter",
        [f"127.0.0.1:{port}"],
        interval=endpoint.get("interval", "15s"),
        honor_labels=bool(endpoint.get("honorLabels")),
        metrics_path=endpoint.get("path", "/metrics"),
        labels=labels,
        metric_relabel_configs=metric_relabel,
    )


def rule_files(rendering: Rendering, work: Path) -> list[Path]:
    out = []
    for rule in rendering.of_kind("PrometheusRule"):
        path = work / f"rules-{rule['metadata']['name']}.yaml"
        path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}, sort_keys=False))
        out.append(path)
    return out


def query(url: str, expr: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{url}/api/v1/query?query={urllib.parse.quote(expr)}", timeout=10) as r:
        return list(json.loads(r.read())["data"]["result"])


def simulated_pods(url: str) -> list[Obj]:
    if not query(url, "inference_queue_depth"):
        return []
    found = query(url, 'group by (namespace, pod) (DCGM_FI_DEV_GPU_UTIL{pod!=""})')
    return [{"name": s["metric"]["pod"], "namespace": s["metric"]["namespace"]} for s in found]


def exporter_phase(renderings: list[Rendering], run: Run) -> int:
    """Each rendering's exporter from its image: to its no-GPU line. Returns the metrics port."""
    port = 0
    for r in renderings:
        ex = r.workload("exporter", "DaemonSet")
        pod = PodRun(ex, r, None, {}, run.work / r.name.replace("/", "-")).prepare()
        try:
            port = ports_of(pod)[0]
            mapped = map_taken_ports(pod, run)
            pod.start()
            served = mapped.get(port, port)
            run.check(r.name, "exporter image, no GPU", partial(checks.exporter_without_gpu, pod, served))
        finally:
            pod.stop()
    return port


def install(r: Rendering, kube: cluster.Cluster, prom_url: str, secrets: dict[str, Obj]) -> str:
    """The rendering into the control plane as users install it; one line."""
    missing = kube.kinds_without_crd(r.objects)
    if r.name == "chart-two-releases":  # the first release, as users have it, then the second beside it
        first = render.chart(prom_url)
        switches = [
            f"{key}=false" for key in render.monitoring_switches(kube.kinds_without_crd(first.objects))
        ]
        kube.helm_install(
            "gpupilot", "gpupilot", [*render.CHART_SETTINGS, f"prometheus.url={prom_url}", *switches]
        )
        if clash := render.clashes(kube.helm_manifest("gpupilot", "gpupilot"), r.objects):
            raise render.RenderError(f"the second release clashes with the first: {'; '.join(clash[:3])}")
    if r.name.startswith("chart"):
        settings = [
            *(r.settings if r.name != "chart" else render.CHART_SETTINGS),
            f"prometheus.url={prom_url}",
        ]
        settings += [f"{key}=false" for key in render.monitoring_switches(missing)]
        kube.helm_install(r.release, "gpupilot", settings, values=r.values)
        r.objects = kube.helm_manifest(r.release, "gpupilot")
        how = "helm install --wait" + (" beside release gpupilot" if r.release != "gpupilot" else "")
    else:
        objs = [o for o in r.objects if o["kind"] not in missing and o["kind"] not in certmanager.KINDS]
        objs += list(secrets.values())
        kube.apply_server_side(objs)
        kube.wait_rollout(r)
        how = "kubectl apply --server-side, rollouts complete"
    pods = kube.kube.list("v1", "Pod", namespace="gpupilot")
    running = sum(1 for p in pods if (p.get("status") or {}).get("phase") == "Running")
    skipped = f"; not installed (no CRD in this cluster): {', '.join(sorted(missing))}" if missing else ""
    return f"{how}: {running}/{len(pods)} pods Running on KWOK nodes{skipped}"


def serving_phase(r: Rendering, pods: list[Obj], run: Run, prom_url: str) -> None:
    where = run.work / r.name.replace("/", "-")
    secrets = certmanager.issue(r) if r.of_kind("Certificate") else {}
    if secrets:
        run.note(
            f"{r.name}: cert-manager stood in for: Secrets {', '.join(sorted(secrets))}; caBundle injected"
        )
    operator_ns = "nvidia-gpu-operator" if r.name.endswith("openshift") else "gpu-operator"
    kube = cluster.start(where, SCENARIO, operator_namespace=operator_ns, kube_tool=run.kube_tool)
    run.note(
        f"{r.name}: Kubernetes {kube.cp.release} control plane with {len(kube.kube.list('v1', 'Node'))} KWOK nodes at {kube.cp.url}"
    )
    running: list[PodRun] = []
    try:
        if not run.check(r.name, "installed", lambda: install(r, kube, prom_url, secrets)):
            return
        run.check(r.name, "admission policies compiled", lambda: checks.policies_type_check(kube, r))
        cluster.seed_pods(kube, pods)
        adapter = PodRun(r.workload("adapter", "Deployment"), r, kube, secrets, where).prepare()
        sizer = PodRun(r.workload("rightsizer", "Deployment"), r, kube, secrets, where).prepare()
        adapter_ports = {**{p: p for p in ports_of(adapter)}, **map_taken_ports(adapter, run)}
        sizer_ports = {**{p: p for p in ports_of(sizer)}, **map_taken_ports(sizer, run)}
        running += [adapter.start(), sizer.start()]
        https = adapter_ports[6443]
        registered = r.of_kind("APIService")
        if registered:
            run.check(r.name, "serving cert vs caBundle", lambda: checks.serving_certificate(r, https))
            if not run.check(r.name, "APIServices Available", lambda: checks.aggregated(kube, r, https)):
                return
        else:  # scaler-only, a second release: the metrics APIs stay with whoever serves them
            run.note(f"{r.name}: no APIService rendered; the aggregation checks do not apply")
        if any(a["spec"]["group"] == "custom.metrics.k8s.io" for a in registered):
            run.check(r.name, "custom.metrics.k8s.io", lambda: checks.custom_metrics(kube))
        if any(a["spec"]["group"] == "external.metrics.k8s.io" for a in r.of_kind("APIService")):
            run.check(r.name, "external.metrics.k8s.io", lambda: checks.external_metrics(kube))
        keda = [a for a in adapter.args if a.startswith("--external-scaler-address=")]
        if keda:
            kport = int(keda[0].rsplit(":", 1)[1])
            run.check(r.name, "KEDA GetMetrics", lambda: checks.keda_get_metrics(adapter, kport))
        tests = [w for w in r.workloads() if w.kind == "Pod"]
        if tests and r.name.startswith("chart"):
            run.check(
                r.name,
                "helm test",
                lambda: helm_test(kube, r=r, tests=tests, secrets=secrets, where=where, running=running),
            )
        (http_port,) = sizer_ports.values()
        run.check(r.name, "rightsizer serve", lambda: checks.rightsizer_serves(http_port, 240))
        for pod in (adapter, sizer):
            if not pod.running():
                last = (pod.output() or [""])[-1][:200]
                run.check(r.name, f"{pod.workload.name} alive", partial(_raise, f"exited: {last}"))
        run.check(r.name, "RBAC: no 403", lambda: checks.no_refusals(kube, "gpupilot"))
    finally:
        for pod in running:
            pod.stop()
        if run.keep:
            run.note(f"{r.name}: the control plane's logs: {kube.cp.logs}, audit log {kube.cp.audit_log}")
        kube.stop()


def helm_test(
    kube: cluster.Cluster,
    *,
    r: Rendering,
    tests: list[Workload],
    secrets: dict[str, Obj],
    where: Path,
    running: list[PodRun],
) -> str:
    """``helm test`` against the cluster: it creates the test hooks (ServiceAccount, RBAC, pod) and
    waits for the pod's phase; each test pod's container runs from its image here with the hook
    ServiceAccount's token, and its exit is reported to the API server as a kubelet would."""
    proc = kube.helm_test(r.release, "gpupilot", log=where / "helm-test.log")
    try:
        lines = []
        for w in tests:
            sa = w.spec.get("serviceAccountName", "default")
            checks.retry(partial(_exists, kube, "ServiceAccount", sa, w.namespace), timeout=60, every=0.5)
            checks.retry(partial(_exists, kube, "Pod", w.name, w.namespace), timeout=60, every=0.5)
            test = PodRun(w, r, kube, secrets, where).prepare()
            running.append(test.start())
            line = checks.helm_test(test, 120)
            code = test.wait(5)
            kube.report_exit(w.namespace, w.name, w.container["name"], 0 if code is None else code)
            lines.append(line)
        code = proc.wait(timeout=120)
    finally:
        process.stop_process(proc)
    tail = (where / "helm-test.log").read_text(errors="replace").strip().splitlines()
    if code != 0:
        raise checks.CheckFailed(f"helm test exit {code}: {(tail or ['no output'])[-1][:200]}")
    phase = next((ln.strip() for ln in tail if ln.strip().startswith("Phase:")), "Phase: ?")
    return f"helm test passed ({phase}); the test pod: {'; '.join(lines)}"


def _exists(kube: cluster.Cluster, kind: str, name: str, namespace: str) -> str:
    if kube.kube.get("v1", kind, name, namespace) is None:
        raise checks.CheckFailed(f"{kind} {namespace}/{name} not created yet")
    return "ok"


def _raise(line: str) -> str:
    raise checks.CheckFailed(line)


def summary(run: Run) -> int:
    wall = time.monotonic() - run.started
    failed = [r for r in run.results if not r.ok]
    print()
    print(f"make e2e: {len(run.results) - len(failed)}/{len(run.results)} checks passed in {wall:.0f} s")
    names = list(dict.fromkeys(r.rendering for r in run.results))
    checks_ = list(dict.fromkeys(r.check for r in run.results))
    width = max(len(c) for c in checks_)
    print(f"  {'':{width}}  " + "  ".join(f"{n:22}" for n in names))
    for c in checks_:
        row = []
        for n in names:
            found = [r for r in run.results if r.rendering == n and r.check == c]
            row.append(f"{('pass' if found[0].ok else 'FAIL') if found else '-':22}")
        print(f"  {c:{width}}  " + "  ".join(row))
    for r in failed:
        print(f"FAIL {r.rendering}: {r.check}: {r.line}")
    print(
        f"Kubernetes {gobuild.TOOLS[run.kube_tool].release} built from its Go modules; KWOK for the kubelets. Not shown here: a kubelet, cert-manager or a GPU (see docs/deploy.md)."
    )
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devkit.e2e", description=__doc__)
    parser.add_argument(
        "--only",
        action="append",
        choices=["chart", *render.CHART_VARIANTS, *render.OVERLAYS],
        help="one rendering (repeatable)",
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the work folder (logs, files) and print it (kept anyway when a check fails)",
    )
    parser.add_argument(
        "--kubernetes",
        choices=sorted(RELEASES),
        default=gobuild.KUBERNETES_RELEASE,
        help="the Kubernetes release of the control plane (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("error: make e2e runs as root (buildah's chroot isolation): sudo make e2e", file=sys.stderr)
        return 2
    missing = [archive(s).name for s in SERVICES if not archive(s).is_file()]
    if missing:
        print(f"error: {ARCHIVES}: {', '.join(missing)} missing: run 'make images' first", file=sys.stderr)
        return 2
    try:  # Prometheus 3 LTS unless GPUPILOT_PROMETHEUS says otherwise; built now when missing
        chosen = prometheus.select_default()
    except prometheus.PrometheusError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"Prometheus {chosen.release} ({prometheus.ENGINE_ENV}={chosen.name})", flush=True)
    work = checks.scratch()
    run = Run(work, keep=args.keep, kube_tool=RELEASES[args.kubernetes])
    server: prometheus.PrometheusServer | None = None
    sim = apps = None
    try:
        prom_port = process.free_port()
        prom_url = f"http://127.0.0.1:{prom_port}"
        wanted = args.only or ["chart", *render.CHART_VARIANTS, *render.OVERLAYS]
        renderings = [
            render.chart(prom_url)
            if n == "chart"
            else render.chart_variant(n, prom_url)
            if n in render.CHART_VARIANTS
            else render.overlay(n, prom_url, work)
            for n in wanted
        ]
        for r in renderings:
            print(f"rendered {r.name}: {len(r.objects)} objects; {'; '.join(r.notes)}", flush=True)
        port = exporter_phase(renderings, run)
        # The data: the simulator on the exporter's port, scraped as the ServiceMonitor says.
        sim_port = port if port_free(port) else process.free_port()
        sim_cmd = [str(Path(sys.executable).parent / "gpupilot-exporter"), "--backend", "sim", "--scenario", str(SCENARIO),
                   "--node", SIM_NODE, "--node-name", SIM_NODE, "--listen", f"127.0.0.1:{sim_port}", "--interval", "5"]  # fmt: skip
        sim = subprocess.Popen(sim_cmd, stdout=(work / "sim.log").open("wb"), stderr=subprocess.STDOUT)
        # The cluster's other series (kube-state-metrics, the applications' inference_queue_depth).
        apps_port = process.free_port()
        apps_cmd = [sim_cmd[0], "cluster", "--scenario", str(SCENARIO), "--listen", f"127.0.0.1:{apps_port}"]
        apps = subprocess.Popen(apps_cmd, stdout=(work / "apps.log").open("wb"), stderr=subprocess.STDOUT)
        server = prometheus.PrometheusServer(
            work / "prometheus" / "data",
            rule_files=rule_files(renderings[0], work),
            scrape_jobs=[
                scrape_job(renderings[0], sim_port),
                prometheus.ScrapeJob("kube-state-metrics", [f"127.0.0.1:{apps_port}"], interval="15s"),
            ],
            port=prom_port,
        )
        server.start(timeout=120)
        pods: list[Obj] = []

        def data() -> str:
            nonlocal pods
            pods = simulated_pods(server.url) if server else []
            if not pods:
                raise checks.CheckFailed("no DCGM_FI_DEV_GPU_UTIL series with a pod yet")
            return f"the simulator on :{sim_port} scraped as the ServiceMonitor says: {len(pods)} GPU pods of {SIM_NODE}"

        if run.check("prometheus", "scrape", lambda: checks.retry(data, timeout=90, every=2)):
            for r in renderings:
                serving_phase(r, pods, run, prom_url)
    except (*ERRORS, prometheus.PrometheusError) as err:
        print(f"error: {str(err).splitlines()[0] if str(err) else type(err).__name__}", file=sys.stderr)
        run.results.append(Result("setup", "set-up", False, str(err).splitlines()[0] if str(err) else ""))
    finally:
        if server is not None:
            server.stop()
        process.stop_process(sim)
        process.stop_process(apps)
        failed = any(not r.ok for r in run.results)
        if args.keep or failed:  # a failure's logs stay where the summary says
            print(f"work folder kept: {work} (the services' and the control plane's logs)")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return summary(run)


if __name__ == "__main__":
    sys.exit(main())
