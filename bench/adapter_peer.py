"""Adapter beside the real peer: gpupilot-adapter and kubernetes-sigs/prometheus-adapter, one run.

prometheus-adapter v0.12.0 is built from its Go module (``devkit.gobuild``'s ``prometheus-adapter``).
Both serve ``custom.metrics.k8s.io`` over the same Prometheus (5,000 pods' ``DCGM_FI_DEV_GPU_UTIL``,
backfilled as in :mod:`bench.adapter`) behind the same real kube-apiserver (``devkit.cluster``: its
aggregation layer, RBAC, front-proxy certificate, delegated authorization by SubjectAccessReview),
with the same 5,000 pods in ``ai-serving`` as API objects (ten deployments of 500; scheduled by no
scheduler, so no scheduler work competes). Each adapter is registered in turn as the APIService
``v1beta2.custom.metrics.k8s.io`` (an ExternalName Service on ``localhost``, its serving certificate
checked against the APIService's caBundle) and asked through the API server what the HPA controller
asks: ``GET …/namespaces/ai-serving/pods/*/DCGM_FI_DEV_GPU_UTIL?labelSelector=app=llm-inference``.

Per adapter: 100 requests one at a time (service time), then open loops at 10 and 100 requests/s
(:func:`bench.adapter.open_loop`, one asyncio loop, 16 kept-alive connections), and 2/s for the
selector matching all 5,000 pods. Reported: p50/p99/max, CPU per answer of the adapter, of Prometheus
and of kube-apiserver (the aggregator's proxying, the peer's pod lists and both adapters' reviews),
Prometheus queries/s, the adapter's peak RSS. prometheus-adapter asks Kubernetes for the pods that
match the selector and Prometheus for their values on every request; gpupilot-adapter answers from
values it refreshes once per interval and the pod cache it keeps by watching.

Run: ``python -m bench.adapter_peer [--seconds 20]`` (``make bench``); needs Go (the control plane
and the peer are built when missing).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import psutil
import requests

from bench.adapter import (
    NAMESPACE,
    PODS_PER_DEPLOYMENT,
    SERIAL_REQUESTS,
    TARGET,
    Result,
    Target,
    memory_mib,
    open_loop,
    pod_names,
    prometheus_queries,
    write_history,
)
from devkit import gobuild, pki
from devkit.cluster import ControlPlane
from devkit.cluster.kubeclient import Kube
from devkit.prometheus import PrometheusServer, backfill_openmetrics, free_port

GROUP, VERSION = "custom.metrics.k8s.io", "v1beta2"
SERVICE_NAMESPACE = "bench"
RATES = (10.0, 100.0)
RATE_ALL = 2.0
PEER_CONFIG = """\
# prometheus-adapter rules for the benchmark: the GPU utilisation of each pod, as its README's
# examples map a pod's series (namespace and pod labels to resources).
rules:
  - seriesQuery: 'DCGM_FI_DEV_GPU_UTIL{namespace!="",pod!=""}'
    resources:
      overrides:
        namespace: {resource: namespace}
        pod: {resource: pod}
    name: {matches: "^(.*)$", as: "${1}"}
    metricsQuery: 'avg(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)'
"""


@dataclass(frozen=True)
class Backend:
    name: str
    """``gpupilot`` or ``prometheus-adapter``."""
    service: str
    port: int
    proc: subprocess.Popen[bytes]
    log: Path


def _pods(kube: Kube) -> int:
    """5,000 pods in ``ai-serving`` (ten apps of 500), created in parallel; no scheduler claims them."""
    core = kube.core()
    names = pod_names()

    def create(item: tuple[str, str]) -> None:
        app, name = item
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app": app, "tier": "gpu"}},
            "spec": {
                "schedulerName": "bench-nobody",
                "containers": [{"name": "server", "image": "registry.invalid/llm:1"}],
            },
        }
        core.create_namespaced_pod(NAMESPACE, body)  # type: ignore[arg-type]  # the client takes plain dicts

    items = [(app, name) for app, group in names.items() for name in group]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(create, items))
    return len(items)


def _wait_service_account(kube: Kube, namespace: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not kube.get("v1", "ServiceAccount", "default", namespace):
        if time.monotonic() > deadline:
            raise RuntimeError(f"no default ServiceAccount in {namespace} after {timeout:.0f} s")
        time.sleep(0.3)


def _register(kube: Kube, backend: Backend, ca: Path) -> None:
    kube.apply(
        {
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": {"name": f"{VERSION}.{GROUP}"},
            "spec": {
                "group": GROUP,
                "version": VERSION,
                "groupPriorityMinimum": 100,
                "versionPriority": 200,
                "caBundle": base64.b64encode(ca.read_bytes()).decode(),
                "service": {"name": backend.service, "namespace": SERVICE_NAMESPACE, "port": backend.port},
            },
        }
    )


def _available(kube: Kube, backend: Backend, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    message = "no condition yet"
    while time.monotonic() < deadline:
        obj = kube.get("apiregistration.k8s.io/v1", "APIService", f"{VERSION}.{GROUP}") or {}
        service = (obj.get("spec") or {}).get("service") or {}
        for cond in (obj.get("status") or {}).get("conditions") or []:
            if cond.get("type") == "Available":
                message = str(cond.get("message", ""))
                if cond.get("status") == "True" and service.get("name") == backend.service:
                    return
        if backend.proc.poll() is not None:
            raise RuntimeError(f"{backend.name} exited: {backend.log.read_text()[-1500:]}")
        time.sleep(0.5)
    raise RuntimeError(f"{backend.name}: the APIService was not Available after {timeout:.0f} s: {message}")


@contextmanager
def _started(
    name: str, cmd: list[str], log: Path, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _cpu(ps: psutil.Process) -> float:
    t = ps.cpu_times()
    return float(t.user + t.system + t.children_user + t.children_system)


def _measure(
    name: str,
    run: Callable[[], Result],
    *,
    adapter: psutil.Process,
    prometheus: psutil.Process,
    apiserver: psutil.Process,
    prom_url: str,
) -> dict[str, object]:
    before = (
        _cpu(adapter),
        _cpu(prometheus),
        _cpu(apiserver),
        prometheus_queries(prom_url),
        time.monotonic(),
    )
    result = run()
    after = (_cpu(adapter), _cpu(prometheus), _cpu(apiserver), prometheus_queries(prom_url), time.monotonic())
    result.seconds = after[4] - before[4]
    result.adapter_cpu_s = after[0] - before[0]
    result.prometheus_cpu_s = after[1] - before[1]
    result.prometheus_queries = after[3] - before[3]
    result.adapter_peak_rss_mib = memory_mib(adapter.pid)[1]
    row = result.row()
    total = max(int(row["requests"]), 1)  # type: ignore[call-overload]
    row["apiserver_cpu_ms_per_request"] = round((after[2] - before[2]) * 1000 / total, 3)
    # per answer given: an adapter that times out on most requests spends its CPU on the few it answers
    row["adapter_cpu_ms_per_answer"] = round(result.adapter_cpu_s * 1000 / max(len(result.latencies), 1), 3)
    row["scenario"] = name
    return row


@dataclass(frozen=True)
class _FileTarget(Target):
    """A target with the client certificate, key and CA as files too (for ``requests``)."""

    tls_files: tuple[str, str, str] = ("", "", "")


def _serial(name: str, count: int, target: _FileTarget) -> Result:
    """``count`` requests one at a time (the service time, no queueing)."""
    result = Result(name, 0.0)
    session = requests.Session()
    cert = target.tls_files
    for _ in range(count):
        t0 = time.perf_counter()
        try:
            r = session.get(target.url, params=target.params, cert=cert[:2], verify=cert[2], timeout=30)
        except requests.RequestException as exc:
            result.fail(type(exc).__name__)
            continue
        elapsed = time.perf_counter() - t0
        if r.status_code != 200:
            result.fail(f"HTTP {r.status_code}")
        elif (got := r.content.count(target.marker)) != target.expect:
            result.fail(f"{got} items, wanted {target.expect}")
        else:
            result.latencies.append(elapsed)
    return result


def in_workdir(prefix: str, workdir: Path | None, body: Callable[[Path], dict[str, Any]]) -> dict[str, Any]:
    """``body`` in ``workdir``, or in a scratch folder (``prefix``) removed after it."""
    root = Path(tempfile.mkdtemp(prefix=prefix)) if workdir is None else workdir
    try:
        return body(root)
    finally:
        if workdir is None:
            shutil.rmtree(root, ignore_errors=True)


def run(*, seconds: float = 20.0, workdir: Path | None = None) -> dict[str, Any]:
    return in_workdir("gpupilot-bench-peer-", workdir, lambda root: _run(root, seconds))


def _run(root: Path, seconds: float) -> dict[str, Any]:
    peer_bin = gobuild.binary("prometheus-adapter")
    history = root / "history.om.txt"
    prom_pods = write_history(history, now=time.time())
    backfill_openmetrics(history, root / "data", block_duration="2h")
    history.unlink()
    serving_ca = pki.make_ca(root / "serving", "serving-ca")
    certs = {
        svc: serving_ca.issue(
            root / "serving", cn=svc, server=True, hosts=(f"{svc}.{SERVICE_NAMESPACE}.svc",), stem=svc
        )
        for svc in ("gpupilot-adapter", "prometheus-adapter")
    }
    (root / "peer.yaml").write_text(PEER_CONFIG)
    rows: list[dict[str, object]] = []
    facts: dict[str, Any] = {}
    with PrometheusServer(root / "data") as prom, ControlPlane(root / "cluster") as cp:
        assert cp.certs is not None
        kube = Kube(cp.admin_kubeconfig)
        for ns in (NAMESPACE, SERVICE_NAMESPACE):
            kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        _wait_service_account(kube, NAMESPACE)
        t0 = time.monotonic()
        facts["pods_in_cluster"] = _pods(kube)
        facts["pods_created_seconds"] = round(time.monotonic() - t0, 1)
        for svc in certs:
            kube.apply(
                {
                    "apiVersion": "v1",
                    "kind": "Service",
                    "metadata": {"name": svc, "namespace": SERVICE_NAMESPACE},
                    "spec": {"type": "ExternalName", "externalName": "localhost"},
                }
            )
        front_proxy = str(cp.certs.front_proxy_ca.path)
        admin = str(cp.admin_kubeconfig)
        ours_port, peer_port = free_port(), free_port()
        ours_cmd = [
            *(sys.executable, "-m", "adapter", "serve", "--prometheus-url", prom.url),
            *("--secure-port", str(ours_port), "--bind-address", "127.0.0.1"),
            *("--tls-cert-file", str(certs["gpupilot-adapter"].cert)),
            *("--tls-private-key-file", str(certs["gpupilot-adapter"].key)),
            *("--requestheader-client-ca-file", front_proxy),
            *("--requestheader-allowed-names", "front-proxy-client", "--authentication-skip-lookup"),
            *("--authorization-mode", "subjectaccessreview"),
            *("--pod-source", "kubernetes", "--kubeconfig", admin, "--refresh-interval", "15"),
        ]
        peer_cmd = [
            str(peer_bin),
            f"--prometheus-url={prom.url}",
            f"--config={root / 'peer.yaml'}",
            f"--secure-port={peer_port}",
            "--bind-address=127.0.0.1",
            f"--tls-cert-file={certs['prometheus-adapter'].cert}",
            f"--tls-private-key-file={certs['prometheus-adapter'].key}",
            f"--cert-dir={root / 'peer-certs'}",
            f"--lister-kubeconfig={admin}",
            f"--authentication-kubeconfig={admin}",
            f"--authorization-kubeconfig={admin}",
            f"--requestheader-client-ca-file={front_proxy}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            "--metrics-relist-interval=1m",
            "--v=1",
        ]
        env = {**os.environ, "MALLOC_ARENA_MAX": "2"}
        apiserver_proc = next(c.proc for c in cp.components if c.name == "kube-apiserver")
        assert apiserver_proc is not None
        apiserver = psutil.Process(apiserver_proc.pid)
        prom_ps = psutil.Process(prom.pid)
        admin_cert, admin_key = str(cp.certs.admin.cert), str(cp.certs.admin.key)
        tls = ssl.create_default_context(cafile=str(cp.ca_file))
        tls.load_cert_chain(admin_cert, admin_key)
        files = (admin_cert, admin_key, str(cp.ca_file))
        path = f"{cp.url}/apis/{GROUP}/{VERSION}/namespaces/{NAMESPACE}/pods/*/DCGM_FI_DEV_GPU_UTIL"

        def target(selector: str, expect: int) -> _FileTarget:
            return _FileTarget(
                path, expect, b'"describedObject"', {"labelSelector": selector}, tls, [], files
            )

        with (
            _started("gpupilot", ours_cmd, root / "ours.log", env) as ours_proc,
            _started("prometheus-adapter", peer_cmd, root / "peer.log") as peer_proc,
        ):
            backends = (
                Backend("gpupilot-adapter", "gpupilot-adapter", ours_port, ours_proc, root / "ours.log"),
                Backend("prometheus-adapter", "prometheus-adapter", peer_port, peer_proc, root / "peer.log"),
            )
            for backend in backends:
                _register(kube, backend, serving_ca.path)
                _available(kube, backend)
                one = target(f"app={TARGET}", PODS_PER_DEPLOYMENT)
                deadline = time.monotonic() + 120
                while _serial("warm", 1, one).latencies == []:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{backend.name} gave no full answer in 120 s; see {backend.log}")
                    time.sleep(1)
                ps = psutil.Process(backend.proc.pid)

                def measure(name: str, job: Callable[[], Result], ps: psutil.Process = ps) -> None:
                    rows.append(
                        _measure(
                            name, job, adapter=ps, prometheus=prom_ps, apiserver=apiserver, prom_url=prom.url
                        )
                    )

                label = backend.name
                jobs: list[tuple[str, Callable[[], Result]]] = [
                    (f"{label} serial", partial(_serial, "serial", SERIAL_REQUESTS, one))
                ]
                jobs += [
                    (f"{label} hpa-500", partial(open_loop, "open", rate, seconds, one)) for rate in RATES
                ]
                every = target("tier=gpu", prom_pods)
                jobs.append((f"{label} hpa-5000", partial(open_loop, "open", RATE_ALL, seconds, every)))
                for name, job in jobs:
                    rows.append(
                        _measure(
                            name, job, adapter=ps, prometheus=prom_ps, apiserver=apiserver, prom_url=prom.url
                        )
                    )
                facts[f"{label}_rss_mib"] = memory_mib(backend.proc.pid)
    facts["goals"] = _goals(rows)
    return {
        "pods_in_prometheus": prom_pods,
        "seconds_per_scenario": seconds,
        "peer": f"kubernetes-sigs/prometheus-adapter {gobuild.PROMETHEUS_ADAPTER_RELEASE} (built from its Go module)",
        "kubernetes": gobuild.KUBERNETES_RELEASE,
        "cpus": os.cpu_count(),
        "load_average_1m_at_end": round(os.getloadavg()[0], 2),
        "scenarios": rows,
        **facts,
    }


def _goals(rows: list[dict[str, object]]) -> dict[str, object]:
    def pick(name: str, rate: float) -> dict[str, Any]:
        return next(r for r in rows if r["scenario"] == name and r["rate_per_s"] == rate)

    out: dict[str, object] = {}
    for rate in (0.0, *RATES):
        ours, peer = (
            pick("gpupilot-adapter hpa-500" if rate else "gpupilot-adapter serial", rate),
            pick("prometheus-adapter hpa-500" if rate else "prometheus-adapter serial", rate),
        )
        key = f"{rate:g}_per_s" if rate else "serial"
        out[f"p99_ratio_{key}"] = round(float(ours["p99_ms"]) / max(float(peer["p99_ms"]), 1e-9), 4)
        out[f"cpu_per_answer_ratio_{key}"] = round(
            float(ours["adapter_cpu_ms_per_answer"]) / max(float(peer["adapter_cpu_ms_per_answer"]), 1e-9), 4
        )
        out[f"peer_failures_{key}"] = sum(peer["failures"].values())
    out["p99_met"] = float(out["p99_ratio_100_per_s"]) <= 0.1  # type: ignore[arg-type]
    out["cpu_met"] = float(out["cpu_per_answer_ratio_100_per_s"]) <= 0.2  # type: ignore[arg-type]
    out["gpupilot_failures"] = sum(
        sum(r["failures"].values())  # type: ignore[attr-defined]
        for r in rows
        if str(r["scenario"]).startswith("gpupilot")
    )
    out["note"] = "a peer's p99 counts only the answers it gave within the client's 30 s timeout"
    return out


def render(res: dict[str, Any]) -> str:
    lines = [
        f"adapter beside {res['peer']}, behind kube-apiserver {res['kubernetes']}'s aggregation layer: "
        f"{res['pods_in_prometheus']} pods in Prometheus and in the cluster, {res['seconds_per_scenario']} s per "
        f"scenario, {res['cpus']} CPUs, load average {res['load_average_1m_at_end']} at the end",
        f"{'scenario':<34}{'rate/s':>7}{'ok':>7}{'fail':>6}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}"
        f"{'adapter CPU ms/answer':>23}{'apiserver ms/req':>18}{'prom CPU ms/req':>17}{'prom q/s':>10}{'peak MiB':>10}",
    ]
    for r in res["scenarios"]:
        rate = f"{r['rate_per_s']:g}" if r["rate_per_s"] else "serial"
        lines.append(
            f"{r['scenario']:<34}{rate:>7}{r['ok']:>7}{sum(r['failures'].values()):>6}{r['p50_ms']:>9}"
            f"{r['p99_ms']:>9}{r['max_ms']:>9}{r['adapter_cpu_ms_per_answer']:>23}"
            f"{r['apiserver_cpu_ms_per_request']:>18}{r['prometheus_cpu_ms_per_request']:>17}"
            f"{r['prometheus_queries_per_s']:>10}{r['adapter_peak_rss_mib']:>10}"
        )
        if r["failures"]:
            lines.append(f"    failures: {r['failures']}")
    lines.append(f"ours ÷ peer (goals at 100/s: p99 ≤ 0.1, CPU per answer ≤ 0.2): {res['goals']}")
    return "\n".join(lines)


def peer_main(
    argv: list[str] | None,
    *,
    prog: str,
    doc: str,
    run: Callable[..., dict[str, Any]],
    render: Callable[[dict[str, Any]], str],
) -> int:
    """The command line of a peer benchmark: ``run(seconds=, workdir=)``, its table, its JSON."""
    parser = argparse.ArgumentParser(prog=prog, description=doc.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="duration of each scenario (default 20)")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON here")
    parser.add_argument("--keep", type=Path, help="work in this folder and keep it (logs, certificates)")
    args = parser.parse_args(argv)
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    res = run(seconds=args.seconds, workdir=args.keep)
    print(render(res))
    if args.json:
        args.json.write_text(json.dumps(res, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    return peer_main(argv, prog="python -m bench.adapter_peer", doc=__doc__ or "", run=run, render=render)


if __name__ == "__main__":
    sys.exit(main())
