"""KEDA's own Prometheus scaler beside the adapter's external scaler, both inside the real KEDA.

KEDA v2.21.0's operator and metrics server (``keda``, ``keda-adapter``, built from its Go module by
``devkit.gobuild``) run beside a real kube-apiserver (``devkit.cluster``) as KEDA runs in a cluster:
its CRDs applied, the metrics server the APIService ``v1beta1.external.metrics.k8s.io`` (ExternalName
Service on ``localhost``; the operator's certificate rotation writes the Secret and patches the
caBundle; a kubelet would mount that Secret into both processes, which this run does by writing its
files), the operator serving the metrics server over mutual TLS gRPC. Two ScaledObjects on two
Deployments in ``ai-serving`` scale on the same number, ``sum(inference_queue_depth{…, app="llm-inference"})``
over 200 pods in the same Prometheus:

* ``prometheus``: KEDA's Prometheus scaler, ``serverAddress`` that Prometheus, that query;
* ``external``: KEDA's external scaler, ``scalerAddress`` the adapter's ``--external-scaler-address``
  (plaintext gRPC), metric ``inference_queue_depth_total`` with ``labelSelector app=llm-inference``.

Each is asked, through the API server, what the HPA controller asks:
``GET /apis/external.metrics.k8s.io/v1beta1/namespaces/ai-serving/<metric>?labelSelector=scaledobject.keda.sh/name=<name>``
(KEDA's metrics server calls the operator, the operator the scaler, per request), one at a time
and in open loops at 10 and 100 requests/s. Reported: p50/p99, CPU per answer of the operator, the
metrics server and the adapter, Prometheus' CPU and queries/s. The HPA controller also asks each
every 5 s throughout. Run: ``python -m bench.keda_peer [--seconds 20]`` (``make bench``).
"""

from __future__ import annotations

import json
import os
import ssl
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import psutil

from bench.adapter import Result, memory_mib, open_loop, prometheus_queries
from bench.adapter_peer import _cpu, _FileTarget, _serial, _started, in_workdir, peer_main
from devkit import gobuild
from devkit.cluster import ControlPlane
from devkit.cluster.keda import Keda
from devkit.cluster.kubeclient import Kube
from devkit.prometheus import PrometheusServer, backfill_openmetrics, free_port

NAMESPACE = "ai-serving"
PODS = 200
RATES = (10.0, 100.0)
SERIAL = 100
CONFIG = """\
external:
  - name: inference_queue_depth_total
    series: inference_queue_depth
    namespaceLabel: namespace
    query: sum(inference_queue_depth{<<matchers>>})
"""
QUERY = f'sum(inference_queue_depth{{namespace="{NAMESPACE}",app="llm-inference"}})'
EXPECTED = sum(i % 20 for i in range(PODS) if i % 2 == 0)
"""Half the pods are app=llm-inference; pod i has queue depth i mod 20."""


def write_history(path: Path, now: float) -> None:
    """``inference_queue_depth`` of 200 pods every 15 s from 5 minutes ago to 30 minutes ahead."""
    stamps = range(int(now) - 300, int(now) + 1800, 15)
    with path.open("w") as out:
        out.write("# TYPE inference_queue_depth gauge\n")
        for i in range(PODS):
            app = "llm-inference" if i % 2 == 0 else "embedder"
            labels = f'namespace="{NAMESPACE}",pod="{app}-{i}",app="{app}"'
            out.writelines(f"inference_queue_depth{{{labels}}} {i % 20} {t}\n" for t in stamps)
        out.write("# EOF\n")


def _scaled_object(name: str, trigger: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "scaleTargetRef": {"name": name},
            "pollingInterval": 30,
            "minReplicaCount": 1,
            "maxReplicaCount": 10,
            "triggers": [trigger],
        },
    }


def _deployment(name: str) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "schedulerName": "bench-nobody",
                    "containers": [{"name": "c", "image": "registry.invalid/consumer:1"}],
                },
            },
        },
    }


def _wait(what: str, check: Any, timeout: float = 180.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(1)
    raise RuntimeError(f"{what} not within {timeout:.0f} s")


def run(*, seconds: float = 20.0, workdir: Path | None = None) -> dict[str, Any]:
    return in_workdir("gpupilot-bench-keda-", workdir, lambda root: _run(root, seconds))


def _run(root: Path, seconds: float) -> dict[str, Any]:
    write_history(root / "history.om.txt", time.time())
    backfill_openmetrics(root / "history.om.txt", root / "data", block_duration="2h")
    (root / "adapter.yaml").write_text(CONFIG)
    rows: list[dict[str, object]] = []
    facts: dict[str, Any] = {}
    with PrometheusServer(root / "data") as prom, ControlPlane(root / "cluster") as cp:
        assert cp.certs is not None
        kube = Kube(cp.admin_kubeconfig)
        kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        scaler_port = free_port()
        ours_cmd = [
            *(
                sys.executable,
                "-m",
                "adapter",
                "serve",
                "--prometheus-url",
                prom.url,
                "--config",
                str(root / "adapter.yaml"),
            ),
            *("--bind-address", "127.0.0.1", "--secure-port", str(free_port())),
            *("--self-signed-cert-dir", str(root / "tls"), "--authorization-mode", "none"),
            *("--pod-source", "none", "--refresh-interval", "5"),
            *("--external-scaler-address", f"127.0.0.1:{scaler_port}"),
        ]
        with (
            Keda(cp, root / "keda") as keda,
            _started(
                "gpupilot-adapter", ours_cmd, root / "adapter.log", {**os.environ, "MALLOC_ARENA_MAX": "2"}
            ) as ours,
        ):
            operator, metrics = keda.operator, keda.metrics
            assert operator is not None and metrics is not None
            triggers = {
                "prometheus": {
                    "type": "prometheus",
                    "metadata": {"serverAddress": prom.url, "query": QUERY, "threshold": "10"},
                },
                "external": {
                    "type": "external",
                    "metadata": {
                        "scalerAddress": f"127.0.0.1:{scaler_port}",
                        "metric": "inference_queue_depth_total",
                        "labelSelector": "app=llm-inference",
                        "targetValue": "10",
                    },
                },
            }
            for kind, trigger in triggers.items():
                kube.apply(_deployment(f"consumer-{kind}"))
                kube.apply(_scaled_object(f"consumer-{kind}", trigger))

            def metric_of(kind: str) -> str | None:
                hpa = (
                    kube.get(
                        "autoscaling/v2", "HorizontalPodAutoscaler", f"keda-hpa-consumer-{kind}", NAMESPACE
                    )
                    or {}
                )
                found = [
                    m["external"]["metric"]["name"]
                    for m in (hpa.get("spec") or {}).get("metrics", [])
                    if m.get("type") == "External"
                ]
                return found[0] if found else None

            names = {
                kind: _wait(f"KEDA's HPA for the {kind} ScaledObject", partial(metric_of, kind))
                for kind in triggers
            }
            tls = ssl.create_default_context(cafile=str(cp.ca_file))
            tls.load_cert_chain(str(cp.certs.admin.cert), str(cp.certs.admin.key))
            files = (str(cp.certs.admin.cert), str(cp.certs.admin.key), str(cp.ca_file))
            processes = {
                "keda-operator": psutil.Process(operator.pid),
                "keda-metrics": psutil.Process(metrics.pid),
                "gpupilot-adapter": psutil.Process(ours.pid),
                "prometheus": psutil.Process(prom.pid),
                "kube-apiserver": psutil.Process(
                    next(c.proc for c in cp.components if c.name == "kube-apiserver").pid
                ),  # type: ignore[union-attr]
            }
            for kind, metric in names.items():
                target = _FileTarget(
                    f"{cp.url}/apis/external.metrics.k8s.io/v1beta1/namespaces/{NAMESPACE}/{metric}",
                    1,
                    f'"value":"{EXPECTED}"'.encode(),
                    {"labelSelector": f"scaledobject.keda.sh/name=consumer-{kind}"},
                    tls,
                    [],
                    files,
                )
                _wait(
                    f"a right answer from the {kind} scaler",
                    lambda target=target: _serial("warm", 1, target).latencies,
                    timeout=120,
                )
                jobs = [("serial", partial(_serial, "serial", SERIAL, target))]
                jobs += [(f"{rate:g}/s", partial(open_loop, "open", rate, seconds, target)) for rate in RATES]
                for label, job in jobs:
                    before = {k: _cpu(p) for k, p in processes.items()}
                    q0, t0 = prometheus_queries(prom.url), time.monotonic()
                    result: Result = job()
                    took = time.monotonic() - t0
                    cpu = {k: _cpu(p) - before[k] for k, p in processes.items()}
                    answers = max(len(result.latencies), 1)
                    row = result.row()
                    row.update(
                        scenario=f"{kind} scaler {label}",
                        keda_cpu_ms_per_answer=round(
                            (cpu["keda-operator"] + cpu["keda-metrics"]) * 1000 / answers, 3
                        ),
                        adapter_cpu_ms_per_answer=round(cpu["gpupilot-adapter"] * 1000 / answers, 3),
                        prometheus_cpu_ms_per_answer=round(cpu["prometheus"] * 1000 / answers, 3),
                        apiserver_cpu_ms_per_answer=round(cpu["kube-apiserver"] * 1000 / answers, 3),
                        prometheus_queries_per_s=round((prometheus_queries(prom.url) - q0) / took, 2),
                    )
                    rows.append(row)
            facts["rss_mib"] = {k: memory_mib(p.pid) for k, p in processes.items() if k != "kube-apiserver"}
    return {
        "keda": gobuild.KEDA_RELEASE,
        "kubernetes": gobuild.KUBERNETES_RELEASE,
        "pods": PODS,
        "seconds_per_scenario": seconds,
        "cpus": os.cpu_count(),
        "load_average_1m_at_end": round(os.getloadavg()[0], 2),
        "scenarios": rows,
        **facts,
    }


def render(res: dict[str, Any]) -> str:
    lines = [
        f"KEDA {res['keda']}'s Prometheus scaler beside the adapter's external scaler, inside KEDA, behind "
        f"kube-apiserver {res['kubernetes']}: {res['pods']} pods, {res['seconds_per_scenario']} s per scenario, "
        f"{res['cpus']} CPUs, load average {res['load_average_1m_at_end']} at the end",
        f"{'scenario':<30}{'ok':>6}{'fail':>6}{'p50 ms':>9}{'p99 ms':>9}{'KEDA CPU ms/ans':>17}{'adapter ms/ans':>16}"
        f"{'prom ms/ans':>13}{'apiserver ms/ans':>18}{'prom q/s':>10}",
    ]
    for r in res["scenarios"]:
        lines.append(
            f"{r['scenario']:<30}{r['ok']:>6}{sum(r['failures'].values()):>6}{r['p50_ms']:>9}{r['p99_ms']:>9}"
            f"{r['keda_cpu_ms_per_answer']:>17}{r['adapter_cpu_ms_per_answer']:>16}{r['prometheus_cpu_ms_per_answer']:>13}"
            f"{r['apiserver_cpu_ms_per_answer']:>18}{r['prometheus_queries_per_s']:>10}"
        )
        if r["failures"]:
            lines.append(f"    failures: {r['failures']}")
    lines.append(f"peak RSS MiB (now, peak): {json.dumps(res.get('rss_mib', {}))}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return peer_main(argv, prog="python -m bench.keda_peer", doc=__doc__ or "", run=run, render=render)


if __name__ == "__main__":
    sys.exit(main())
