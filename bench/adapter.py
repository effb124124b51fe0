"""Adapter benchmark: gpupilot-adapter vs the prometheus-adapter query pattern, one run, one Prometheus.

A real Prometheus holds 5,000 pods' GPU series (backfilled, with kube-state-metrics' pod labels)
in namespace ``ai-serving``: ten deployments of 500 pods. Scenarios, each at a fixed request rate
(open loop: requests are sent on schedule, whatever the answers' latency):

* ``hpa-500``: the HPA's call for the 500-pod deployment ``llm-inference``:
  ``GET /apis/custom.metrics.k8s.io/v1beta2/namespaces/ai-serving/pods/*/DCGM_FI_DEV_GPU_UTIL
  ?labelSelector=app=llm-inference`` over HTTPS to ``gpupilot-adapter serve`` (a real subprocess,
  ``--pod-source prometheus``), at 50 requests/s.
* baseline ``regex-500``: what prometheus-adapter sends for the same call — one instant query
  ``sum(DCGM_FI_DEV_GPU_UTIL{namespace="ai-serving",pod=~"a|b|…"}) by (pod)`` as a GET URL —
  straight to Prometheus (no TLS, no adapter in between: the baseline's best case), at 50/s.
* ``hpa-5000`` / ``regex-5000``: the same with a selector matching all 5,000 pods, at 2/s (thirty
  HPAs on 5,000-pod targets, each syncing every 15 s).
* ``serial``: 100 requests one at a time for each 500-pod path: service time without queueing.

Reported: p50/p99/max latency, failures (non-200, wrong item count, or no answer within 30 s),
the baseline's URL length,
and the adapter's peak RSS (VmHWM). Goals: p99 ≤ 50 ms at 50/s, RSS ≤ 120 MiB, zero failures.
Run: ``python -m bench.adapter [--seconds 20]`` (``make bench`` runs it with the others).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import requests

from devkit import pki
from devkit.prometheus import PrometheusServer, backfill_openmetrics, free_port

NAMESPACE = "ai-serving"
DEPLOYMENTS = 10
PODS_PER_DEPLOYMENT = 500
TARGET = "llm-inference"
RATE_500 = 50.0
RATE_5000 = 2.0
SERIAL_REQUESTS = 100
CLIENT_TIMEOUT = 30.0
"""Seconds before the load generator counts a request as failed (kube-apiserver allows 60 s)."""


def pod_names() -> dict[str, list[str]]:
    apps = [TARGET] + [f"model-{i}" for i in range(1, DEPLOYMENTS)]
    return {app: [f"{app}-6f8d9c7b5-{i:05d}" for i in range(PODS_PER_DEPLOYMENT)] for app in apps}


def write_history(path: Path, *, now: float, before: int = 300, after: int = 1200, step: int = 15) -> int:
    """OpenMetrics for every pod: GPU utilisation, kube_pod_labels, Running phase. Returns pods."""
    start, end = int(now) - before, int(now) + after
    stamps = list(range(start, end + 1, step))
    pods = pod_names()
    with path.open("w") as out:
        for family in ("DCGM_FI_DEV_GPU_UTIL", "kube_pod_labels", "kube_pod_status_phase"):
            out.write(f"# TYPE {family} gauge\n")
            n = 0
            for app, names in pods.items():
                for name in names:
                    n += 1
                    if family == "DCGM_FI_DEV_GPU_UTIL":
                        labels = (
                            f'gpu="{n % 8}",UUID="GPU-{n:06d}",Hostname="gpu-node-{n // 8:04d}",'
                            f'namespace="{NAMESPACE}",pod="{name}"'
                        )
                        value = float(40 + n % 50)
                    elif family == "kube_pod_labels":
                        labels = f'namespace="{NAMESPACE}",pod="{name}",label_app="{app}",label_tier="gpu"'
                        value = 1.0
                    else:
                        labels = f'namespace="{NAMESPACE}",pod="{name}",phase="Running"'
                        value = 1.0
                    out.writelines(f"{family}{{{labels}}} {value} {t}\n" for t in stamps)
        out.write("# EOF\n")
    return sum(len(v) for v in pods.values())


@dataclass
class Result:
    name: str
    rate: float
    latencies: list[float] = field(default_factory=list)
    failures: dict[str, int] = field(default_factory=dict)
    behind: float = 0.0
    adapter_cpu_s: float = 0.0
    """CPU seconds the adapter process used during the scenario (0 for baseline scenarios)."""
    prometheus_cpu_s: float = 0.0
    """Largest delay between a request's schedule and its send (load generator saturation)."""

    def fail(self, why: str) -> None:
        self.failures[why] = self.failures.get(why, 0) + 1

    def pct(self, p: float) -> float:
        if not self.latencies:
            return float("nan")
        data = sorted(self.latencies)
        return data[min(len(data) - 1, round(p / 100 * (len(data) - 1)))] * 1000

    def row(self) -> dict[str, object]:
        total = len(self.latencies) + sum(self.failures.values())
        return {
            "scenario": self.name,
            "rate_per_s": self.rate,
            "requests": total,
            "ok": len(self.latencies),
            "failures": dict(self.failures),
            "p50_ms": round(self.pct(50), 1),
            "p99_ms": round(self.pct(99), 1),
            "max_ms": round(self.pct(100), 1),
            "max_send_lag_ms": round(self.behind * 1000, 1),
            "adapter_cpu_ms_per_request": round(self.adapter_cpu_s * 1000 / max(total, 1), 2),
            "prometheus_cpu_ms_per_request": round(self.prometheus_cpu_s * 1000 / max(total, 1), 2),
        }


def open_loop(
    name: str, rate: float, seconds: float, call: Callable[[requests.Session], str | None], workers: int = 16
) -> Result:
    """Send ``rate × seconds`` requests on schedule; ``call`` returns None or a failure reason."""
    result = Result(name, rate)
    jobs: queue.Queue[float | None] = queue.Queue()
    lock = threading.Lock()

    def worker() -> None:
        session = requests.Session()
        while True:
            due = jobs.get()
            if due is None:
                return
            wait = due - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            lag = time.perf_counter() - due
            t0 = time.perf_counter()
            try:
                why = call(session)
            except requests.RequestException as exc:
                why = type(exc).__name__
            elapsed = time.perf_counter() - t0
            with lock:
                result.behind = max(result.behind, lag)
                if why is None:
                    result.latencies.append(elapsed)
                else:
                    result.fail(why)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(workers)]
    for t in threads:
        t.start()
    start = time.perf_counter() + 0.2
    for i in range(int(rate * seconds)):
        jobs.put(start + i / rate)
    for _ in threads:
        jobs.put(None)
    for t in threads:
        t.join()
    return result


def serial(name: str, count: int, call: Callable[[requests.Session], str | None]) -> Result:
    """One request at a time: the service time of a path without queueing."""
    result = Result(name, 0.0)
    session = requests.Session()
    for _ in range(count):
        t0 = time.perf_counter()
        try:
            why = call(session)
        except requests.RequestException as exc:
            why = type(exc).__name__
        if why is None:
            result.latencies.append(time.perf_counter() - t0)
        else:
            result.fail(why)
    return result


def _mint_tls(directory: Path) -> tuple[Path, Path, Path, Path]:
    """Serving pair for 127.0.0.1 and a client certificate (CA-issued) for the load generator."""
    ca = pki.make_ca(directory, "ca", cn="bench-ca", days=1)
    server = ca.issue(directory, cn="adapter", server=True)
    client = ca.issue(directory, cn="hpa-bench")
    (directory / "client.pem").write_bytes(client.cert.read_bytes() + client.key.read_bytes())
    return ca.path, server.cert, server.key, directory / "client.pem"


def _cpu(ps: psutil.Process | None) -> float:
    if ps is None:
        return 0.0
    t = ps.cpu_times()
    return float(t.user + t.system)


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def run(*, seconds: float = 20.0, workdir: Path | None = None) -> dict[str, object]:
    own_dir = workdir is None
    root = Path(tempfile.mkdtemp(prefix="gpupilot-bench-adapter-")) if workdir is None else workdir
    try:
        return _run(root, seconds)
    finally:
        if own_dir:
            shutil.rmtree(root, ignore_errors=True)


def _run(root: Path, seconds: float) -> dict[str, object]:
    t0 = time.time()
    history = root / "history.om.txt"
    total_pods = write_history(history, now=t0)
    backfill_openmetrics(history, root / "data", block_duration="2h")
    history.unlink()
    setup_s = time.time() - t0
    ca, cert, key, client_pem = _mint_tls(root)
    names = pod_names()
    with PrometheusServer(root / "data") as prom:
        port = free_port()
        cmd = [
            sys.executable,
            "-m",
            "adapter",
            "serve",
            "--prometheus-url",
            prom.url,
            "--secure-port",
            str(port),
            "--bind-address",
            "127.0.0.1",
            "--tls-cert-file",
            str(cert),
            "--tls-private-key-file",
            str(key),
            "--client-ca-file",
            str(ca),
            "--authorization-mode",
            "none",
            "--pod-source",
            "prometheus",
        ]
        env = {**os.environ, "MALLOC_ARENA_MAX": "2"}  # as deploy/adapter sets it
        proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=(root / "adapter.log").open("w"), env=env
        )
        try:
            base = f"https://127.0.0.1:{port}"
            deadline = time.time() + 30
            while time.time() < deadline:
                try:
                    if requests.get(f"{base}/readyz", verify=str(ca), timeout=2).status_code == 200:
                        break
                except requests.RequestException:
                    time.sleep(0.2)
            path = f"{base}/apis/custom.metrics.k8s.io/v1beta2/namespaces/{NAMESPACE}/pods/*/DCGM_FI_DEV_GPU_UTIL"

            def adapter_call(selector: str, expect: int) -> Callable[[requests.Session], str | None]:
                def call(s: requests.Session) -> str | None:
                    r = s.get(
                        path,
                        params={"labelSelector": selector},
                        cert=str(client_pem),
                        verify=str(ca),
                        timeout=10,
                    )
                    if r.status_code != 200:
                        return f"HTTP {r.status_code}"
                    got = len(r.json()["items"])
                    return None if got == expect else f"{got} items, wanted {expect}"

                return call

            def regex_url(pods: list[str]) -> str:
                query = (
                    f'sum(DCGM_FI_DEV_GPU_UTIL{{namespace="{NAMESPACE}",pod=~"{"|".join(pods)}"}}) by (pod)'
                )
                return f"{prom.url}/api/v1/query?" + urllib.parse.urlencode({"query": query})

            def baseline_call(url: str, expect: int) -> Callable[[requests.Session], str | None]:
                def call(s: requests.Session) -> str | None:
                    r = s.get(url, timeout=CLIENT_TIMEOUT)
                    if r.status_code != 200:
                        return f"HTTP {r.status_code}"
                    got = len(r.json()["data"]["result"])
                    return None if got == expect else f"{got} series, wanted {expect}"

                return call

            all_pods = [n for group in names.values() for n in group]
            url_500, url_5000 = regex_url(names[TARGET]), regex_url(all_pods)
            # warm both paths once (first pod listing, connection pools)
            warm = requests.Session()
            adapter_call(f"app={TARGET}", PODS_PER_DEPLOYMENT)(warm)
            adapter_call("tier=gpu", total_pods)(warm)
            adapter_ps = psutil.Process(proc.pid)
            prom_ps = psutil.Process(prom._proc.pid) if prom._proc is not None else None
            scenarios: list[Callable[[], Result]] = [
                lambda: serial(
                    "gpupilot hpa-500 serial",
                    SERIAL_REQUESTS,
                    adapter_call(f"app={TARGET}", PODS_PER_DEPLOYMENT),
                ),
                lambda: serial(
                    "baseline regex-500 serial", SERIAL_REQUESTS, baseline_call(url_500, PODS_PER_DEPLOYMENT)
                ),
                lambda: open_loop(
                    "gpupilot hpa-500", RATE_500, seconds, adapter_call(f"app={TARGET}", PODS_PER_DEPLOYMENT)
                ),
                lambda: open_loop(
                    "baseline regex-500 (GET)", RATE_500, seconds, baseline_call(url_500, PODS_PER_DEPLOYMENT)
                ),
                lambda: open_loop(
                    "gpupilot hpa-5000", RATE_5000, seconds, adapter_call("tier=gpu", total_pods)
                ),
                lambda: open_loop(
                    "baseline regex-5000 (GET)", RATE_5000, seconds, baseline_call(url_5000, total_pods)
                ),
            ]
            results = []
            for scenario in scenarios:
                before = (_cpu(adapter_ps), _cpu(prom_ps))
                result = scenario()
                result.adapter_cpu_s = _cpu(adapter_ps) - before[0]
                result.prometheus_cpu_s = _cpu(prom_ps) - before[1]
                results.append(result)
            rss = peak_rss_mib(proc.pid)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
    rows = [r.row() for r in results]
    by_name = {str(r["scenario"]): r for r in rows}
    hpa500, hpa5000 = by_name["gpupilot hpa-500"], by_name["gpupilot hpa-5000"]
    return {
        "pods_in_prometheus": total_pods,
        "setup_seconds": round(setup_s, 1),
        "seconds_per_scenario": seconds,
        "baseline_url_bytes": {"regex-500": len(url_500), "regex-5000": len(url_5000)},
        "adapter_peak_rss_mib": round(rss, 1),
        "cpus": os.cpu_count(),
        "load_average_1m_at_end": round(os.getloadavg()[0], 1),
        "scenarios": rows,
        "goals": {
            "p99_ms_at_50_per_s": hpa500["p99_ms"],
            "p99_goal_met": bool(hpa500["p99_ms"] <= 50),  # type: ignore[operator]
            "rss_goal_met": rss <= 120,
            "zero_failures": not hpa500["failures"] and not hpa5000["failures"],
        },
    }


def render(res: dict[str, object]) -> str:
    lines = [
        f"adapter benchmark: {res['pods_in_prometheus']} pods in Prometheus, {res['seconds_per_scenario']} s per scenario, "
        f"{res['cpus']} CPUs, load average {res['load_average_1m_at_end']} at the end",
        f"{'scenario':<28}{'rate/s':>7}{'ok':>7}{'fail':>6}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}"
        f"{'adapter CPU ms/req':>20}{'prom CPU ms/req':>17}",
    ]
    for r in res["scenarios"]:  # type: ignore[attr-defined]
        fails = sum(r["failures"].values())
        rate = f"{r['rate_per_s']:g}" if r["rate_per_s"] else "serial"
        lines.append(
            f"{r['scenario']:<28}{rate:>7}{r['ok']:>7}{fails:>6}{r['p50_ms']:>9}{r['p99_ms']:>9}{r['max_ms']:>9}"
            f"{r['adapter_cpu_ms_per_request']:>20}{r['prometheus_cpu_ms_per_request']:>17}"
        )
        if r["failures"]:
            lines.append(f"    failures: {r['failures']}")
    lines.append(f"baseline GET URL bytes: {res['baseline_url_bytes']}")
    lines.append(f"adapter peak RSS: {res['adapter_peak_rss_mib']} MiB; goals: {res['goals']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.adapter", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="duration of each scenario (default 20)")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON here")
    args = parser.parse_args(argv)
    res = run(seconds=args.seconds)
    print(render(res))
    if args.json:
        args.json.write_text(json.dumps(res, indent=2))
    goals = res["goals"]
    missed = [k for k in ("p99_goal_met", "rss_goal_met", "zero_failures") if not goals[k]]  # type: ignore[index]
    if missed:
        print(f"goals missed on this machine: {', '.join(missed)} (see the load average above)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
