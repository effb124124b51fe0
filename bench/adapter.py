"""Adapter benchmark: gpupilot-adapter (values from memory) vs the per-request baseline, one run.

A real Prometheus holds 5,000 pods' GPU series (backfilled) in namespace ``ai-serving``: ten
deployments of 500 pods. The adapter runs as a real subprocess with ``--pod-source kubernetes``
against a pods API (below) listing **50,000 pods** (the 5,000 plus 45,000 in 90 other namespaces),
so its memory is measured with a cluster-sized pod cache. Scenarios, each open loop (requests sent
on schedule, whatever the answers' latency):

* ``gpupilot hpa-500`` at 10 and 100 requests/s: the HPA's call for the 500-pod deployment,
  ``GET /apis/custom.metrics.k8s.io/v1beta2/namespaces/ai-serving/pods/*/DCGM_FI_DEV_GPU_UTIL
  ?labelSelector=app=llm-inference``, as kube-apiserver's aggregation layer forwards it: over HTTPS
  with the front-proxy client certificate, the HPA controller's identity in ``X-Remote-User`` /
  ``X-Remote-Group`` (trusted through ``--requestheader-client-ca-file``), authorised by
  SubjectAccessReview (``--authorization-mode subjectaccessreview``; the pods API below answers the
  reviews and counts them, and the adapter caches each verdict for 10 s).
* baseline ``regex-500`` at 10 and 100/s: what a per-request adapter (prometheus-adapter, KEDA)
  sends for the same call — one instant query ``sum(DCGM_FI_DEV_GPU_UTIL{namespace=…,pod=~"a|b|…"})
  by (pod)`` as a GET — straight to Prometheus (no TLS, no adapter: the baseline's best case).
* ``hpa-5000`` / ``regex-5000`` at 2/s: a selector matching all 5,000 pods.
* ``floor`` at 100/s, right after ``gpupilot hpa-500`` at 100/s: :mod:`bench.tls_floor`, aiohttp's
  server over asyncio's TLS with the adapter's TLS settings, answering every request with the
  adapter's own gzip-encoded 500-pod answer and doing nothing else. Its CPU per request is what
  HTTP + TLS cost on this machine at that moment; the adapter's CPU per answer minus it is the
  adapter's own work. (This shared machine's speed changes by up to 2× between runs: the same code
  measured 0.45 and 0.9 ms per answer an hour apart; the floor moves with it.)
* ``serial``: 100 requests one at a time for each 500-pod path (service time without queueing).
* ``slow connections``: 2,000 clients that send the first 5 bytes of a TLS record and stall (each
  one the adapter takes costs it a TLS object), held while the adapter's RSS is read and real requests
  are timed; ``--max-connections`` is left at its default (512), so the rest wait in the backlog.

Reported per scenario: p50/p99/max latency, failures, CPU per request of the adapter and of
Prometheus, and Prometheus queries per second (Prometheus' own ``/api/v1/query`` counter). Latency is
from sending a request to holding its whole (decompressed) body. Open-loop scenarios are sent from one
asyncio loop (aiohttp's client, 16 kept-alive connections), serial ones with ``requests``;
checking the answers is the load generator's own work and runs after the clock stops, for both sides.
Both are asked the way their real clients ask, with ``Accept-Encoding: gzip, deflate``, which both
Prometheus and the adapter honour for large answers. Goals
(issue 15): p99 ≤ 10 ms at 100/s, adapter CPU ≤ 1 ms per 500-pod answer, Prometheus queries flat
from 10 to 100/s, RSS ≤ 150 MiB at 50,000 pods, 2,000 slow connections under the Deployment's
192 MiB limit. Run: ``python -m bench.adapter [--seconds 20] [--pods 50000]`` (``make bench``).

The pods API is a small HTTP server in this process serving ``/api/v1/pods`` pages (``limit`` /
``continue``) of realistic pod objects (labels, owner, two containers, status with conditions;
about 2.5 KB each), an idle watch, and SubjectAccessReviews (allowed): the Kubernetes API double in
``tests/`` keeps whole objects and would spend minutes listing 50,000 pods.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import aiohttp
import psutil
import requests
import yaml

from devkit import pki
from devkit.prometheus import PrometheusServer, backfill_openmetrics, free_port

NAMESPACE = "ai-serving"
DEPLOYMENTS = 10
PODS_PER_DEPLOYMENT = 500
TARGET = "llm-inference"
RATES_500 = (10.0, 100.0)
RATE_5000 = 2.0
SERIAL_REQUESTS = 100
SLOW_CONNECTIONS = 2000
CLIENT_TIMEOUT = 30.0
"""Seconds before the load generator counts a request as failed (kube-apiserver allows 60 s)."""
DEPLOYMENT_LIMIT_MIB = 192


def pod_names() -> dict[str, list[str]]:
    apps = [TARGET] + [f"model-{i}" for i in range(1, DEPLOYMENTS)]
    return {app: [f"{app}-6f8d9c7b5-{i:05d}" for i in range(PODS_PER_DEPLOYMENT)] for app in apps}


def write_history(path: Path, *, now: float, before: int = 300, after: int = 1800, step: int = 15) -> int:
    """OpenMetrics for every pod of ``ai-serving``: GPU utilisation. Returns the pod count."""
    start, end = int(now) - before, int(now) + after
    stamps = list(range(start, end + 1, step))
    pods = pod_names()
    with path.open("w") as out:
        out.write("# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n")
        n = 0
        for names in pods.values():
            for name in names:
                n += 1
                labels = (
                    f'gpu="{n % 8}",UUID="GPU-{n:06d}",Hostname="gpu-node-{n // 8:04d}",'
                    f'namespace="{NAMESPACE}",pod="{name}"'
                )
                out.writelines(f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {40 + n % 50} {t}\n" for t in stamps)
        out.write("# EOF\n")
    return sum(len(v) for v in pods.values())


# -- the pods API ---------------------------------------------------------------------------------
def _pod_json(namespace: str, name: str, app: str, n: int) -> str:
    return json.dumps(
        {
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": f"4f7c6a52-{n:08d}-4e2b-9b1d-{n:012d}",
                "resourceVersion": str(1000 + n),
                "creationTimestamp": "2026-11-29T08:00:00Z",
                "generateName": f"{app}-6f8d9c7b5-",
                "labels": {"app": app, "pod-template-hash": "6f8d9c7b5", "tier": "gpu"},
                "annotations": {"kubectl.kubernetes.io/restartedAt": "2026-11-29T07:59:00Z"},
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "ReplicaSet",
                        "name": f"{app}-6f8d9c7b5",
                        "uid": f"rs-{app}",
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": {
                "nodeName": f"gpu-node-{n // 8:05d}",
                "serviceAccountName": "default",
                "containers": [
                    {
                        "name": "server",
                        "image": "registry.example/llm/server:2026.11",
                        "args": ["--port=8000", "--model=/models/current"],
                        "ports": [{"containerPort": 8000, "protocol": "TCP"}],
                        "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"cpu": "4"}},
                        "env": [{"name": "MODEL_DIR", "value": "/models/current"}],
                        "volumeMounts": [{"name": "models", "mountPath": "/models"}],
                    },
                    {"name": "metrics", "image": "registry.example/sidecar:1.4", "resources": {}},
                ],
                "volumes": [{"name": "models", "persistentVolumeClaim": {"claimName": "models"}}],
            },
            "status": {
                "phase": "Running",
                "podIP": f"10.{n // 65536 % 256}.{n // 256 % 256}.{n % 256}",
                "startTime": "2026-11-29T08:00:05Z",
                "conditions": [
                    {"type": t, "status": "True", "lastTransitionTime": "2026-11-29T08:00:30Z"}
                    for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
                ],
                "containerStatuses": [
                    {
                        "name": c,
                        "ready": True,
                        "restartCount": 0,
                        "image": "registry.example/llm/server:2026.11",
                        "containerID": f"containerd://{n:064x}",
                        "state": {"running": {"startedAt": "2026-11-29T08:00:20Z"}},
                    }
                    for c in ("server", "metrics")
                ],
            },
        },
        separators=(",", ":"),
    )


class PodsApi:
    """``GET /api/v1/pods`` in pages and an idle watch, for ``total`` pods (5,000 in ai-serving)."""

    def __init__(self, total: int) -> None:
        names = pod_names()
        self.pods: list[tuple[str, str, str]] = [
            (NAMESPACE, name, app) for app, group in names.items() for name in group
        ]
        extra = total - len(self.pods)
        for i in range(max(0, extra)):
            self.pods.append((f"team-{i // 500:03d}", f"worker-{i:06d}", f"svc-{i // 100:04d}"))
        self.pages = 0
        self.reviews = 0
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                if self.path.split("?")[0] != "/apis/authorization.k8s.io/v1/subjectaccessreviews":
                    self.send_error(404)
                    return
                review = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                review["status"] = {"allowed": True, "reason": "bench"}
                api.reviews += 1
                body = json.dumps(review).encode()
                self.send_response(201)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                query = dict(urllib.parse.parse_qsl(url.query))
                if url.path != "/api/v1/pods":
                    self.send_error(404)
                    return
                if query.get("watch") in ("true", "1"):
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    time.sleep(min(float(query.get("timeoutSeconds", 300)), 3600))
                    self.wfile.write(b"0\r\n\r\n")
                    return
                limit = int(query.get("limit") or len(api.pods))
                offset = int(query.get("continue") or 0)
                page = api.pods[offset : offset + limit]
                meta = {"resourceVersion": "99999"}
                if offset + limit < len(api.pods):
                    meta["continue"] = str(offset + limit)
                body = (
                    '{"kind":"PodList","apiVersion":"v1","metadata":'
                    + json.dumps(meta)
                    + ',"items":['
                    + ",".join(_pod_json(ns, name, app, offset + i) for i, (ns, name, app) in enumerate(page))
                    + "]}"
                ).encode()
                api.pages += 1
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def kubeconfig(self, path: Path) -> Path:
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "bench", "cluster": {"server": self.url}}],
            "users": [{"name": "bench", "user": {"token": "bench"}}],
            "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": "bench"}}],
            "current-context": "bench",
        }
        path.write_text(yaml.safe_dump(doc))
        return path

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# -- load generation ------------------------------------------------------------------------------
Check = Callable[[], "str | None"]
"""Validates an answer received: None when right, else the failure (run after the clock stops)."""
Call = Callable[[requests.Session], Check]
"""Sends one request and reads its whole body (timed), returning the check of the answer."""


def timed(call: Call, session: requests.Session) -> tuple[float, str | None]:
    """(seconds from send to the last body byte, failure or None); parsing and checking the body is
    the load generator's own work and runs after the clock stops, for both sides alike."""
    t0 = time.perf_counter()
    try:
        check = call(session)
    except requests.RequestException as exc:
        return time.perf_counter() - t0, type(exc).__name__
    elapsed = time.perf_counter() - t0
    return elapsed, check()


@dataclass
class Result:
    name: str
    rate: float
    latencies: list[float] = field(default_factory=list)
    failures: dict[str, int] = field(default_factory=dict)
    behind: float = 0.0
    """Largest delay between a request's schedule and its send (load generator saturation)."""
    seconds: float = 0.0
    adapter_cpu_s: float = 0.0
    adapter_sys_s: float = 0.0
    """Of ``adapter_cpu_s``, the kernel's (system time: TLS records through loopback TCP)."""
    prometheus_cpu_s: float = 0.0
    prometheus_queries: float = 0.0
    adapter_peak_rss_mib: float = 0.0
    server_within_ms: dict[str, float] = field(default_factory=dict)
    """Share of the adapter's metric requests it handled within each histogram bound (its own
    ``gpupilot_adapter_request_duration_seconds``: request parsed → answer handed to the socket),
    which leaves out the load generator and the kernel's scheduling of both."""
    """The adapter's VmHWM after the scenario (0 for baseline scenarios' own cost)."""

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
            "adapter_cpu_ms_per_request": round(self.adapter_cpu_s * 1000 / max(total, 1), 3),
            "adapter_system_ms_per_request": round(self.adapter_sys_s * 1000 / max(total, 1), 2),
            "prometheus_cpu_ms_per_request": round(self.prometheus_cpu_s * 1000 / max(total, 1), 2),
            "prometheus_queries_per_s": round(self.prometheus_queries / max(self.seconds, 1e-9), 2),
            "adapter_peak_rss_mib": round(self.adapter_peak_rss_mib, 1),
            "adapter_handled_within_ms": self.server_within_ms,
        }


@dataclass(frozen=True)
class Target:
    """One kind of request of an open-loop scenario: where, how, and how to recognise a full answer."""

    url: str
    expect: int
    """Items (adapter) or series (Prometheus) a right answer holds."""
    marker: bytes
    """Bytes that open each item or series in the answer (counted, not parsed: see :func:`open_loop`)."""
    params: dict[str, str] = field(default_factory=dict)
    tls: ssl.SSLContext | None = None
    headers: list[tuple[str, str]] = field(default_factory=list)


async def _send(session: aiohttp.ClientSession, target: Target) -> tuple[int, bytes]:
    async with session.get(
        target.url, params=target.params, ssl=target.tls or False, headers=target.headers
    ) as resp:
        return resp.status, await resp.read()


def open_loop(name: str, rate: float, seconds: float, target: Target, connections: int = 16) -> Result:
    """Send ``rate × seconds`` requests on schedule from one asyncio loop over up to
    ``connections`` kept-alive connections; a request's latency runs from its send to the last byte
    of its (decompressed) body.

    One thread and no GIL: a pool of threads running ``requests`` measured its own scheduling — a
    thread whose answer had arrived waited for the GIL (5 ms switch interval) while others parsed
    JSON. Answers are checked by counting ``target.marker`` (a C-speed scan) and their status, after
    the clock stops; nothing is parsed while other requests are in flight."""
    result = Result(name, rate)
    answers: list[tuple[int, bytes]] = []

    async def one(session: aiohttp.ClientSession, due: float, loop: asyncio.AbstractEventLoop) -> None:
        result.behind = max(result.behind, loop.time() - due)
        t0 = time.perf_counter()
        try:
            answer = await _send(session, target)
        except (aiohttp.ClientError, TimeoutError) as exc:
            result.fail(type(exc).__name__)
            return
        result.latencies.append(time.perf_counter() - t0)
        answers.append(answer)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        connector = aiohttp.TCPConnector(limit=connections)
        timeout = aiohttp.ClientTimeout(total=CLIENT_TIMEOUT)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            start = loop.time() + 0.2
            tasks = []
            for i in range(int(rate * seconds)):
                due = start + i / rate
                if (wait := due - loop.time()) > 0:
                    await asyncio.sleep(wait)
                tasks.append(asyncio.ensure_future(one(session, due, loop)))
            await asyncio.gather(*tasks)

    asyncio.run(main())
    ok: list[float] = []
    for elapsed, (status, body) in zip(result.latencies, answers, strict=True):
        if status != 200:
            result.fail(f"HTTP {status}")
        elif (got := body.count(target.marker)) != target.expect:
            result.fail(f"{got} items, wanted {target.expect}")
        else:
            ok.append(elapsed)
    result.latencies = ok
    return result


def serial(name: str, count: int, call: Call) -> Result:
    """One request at a time: the service time of a path without queueing."""
    result = Result(name, 0.0)
    session = requests.Session()
    for _ in range(count):
        elapsed, why = timed(call, session)
        if why is None:
            result.latencies.append(elapsed)
        else:
            result.fail(why)
    return result


HPA_USER = "system:serviceaccount:kube-system:horizontal-pod-autoscaler"
HPA_GROUPS = ("system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated")
FRONT_PROXY_CN = "front-proxy-client"
AS_HPA: list[tuple[str, str]] = [("X-Remote-User", HPA_USER)] + [("X-Remote-Group", g) for g in HPA_GROUPS]
"""The headers kube-apiserver's aggregation layer adds for the HPA controller (a line per group)."""


def _mint_tls(directory: Path) -> tuple[Path, Path, Path, Path, Path]:
    """(serving CA, serving cert, its key, front-proxy client PEM, front-proxy CA): the serving pair
    for 127.0.0.1 and the aggregation layer's client certificate, from its own CA, as clusters have."""
    ca = pki.make_ca(directory, "ca", cn="bench-ca", days=1)
    server = ca.issue(directory, cn="adapter", server=True)
    front_proxy = pki.make_ca(directory, "front-proxy-ca", cn="front-proxy-ca", days=1)
    client = front_proxy.issue(directory, cn=FRONT_PROXY_CN)
    (directory / "client.pem").write_bytes(client.cert.read_bytes() + client.key.read_bytes())
    return ca.path, server.cert, server.key, directory / "client.pem", front_proxy.path


FLOOR = "floor: aiohttp+TLS, one body"
"""The floor scenario (``bench.tls_floor``): its "adapter CPU" column is the floor server's CPU."""


@dataclass
class Floor:
    proc: subprocess.Popen[bytes]
    url: str


def _gzip_answer(path: str, client_pem: Path, ca: Path, root: Path) -> Path:
    """The adapter's gzip-encoded 500-pod answer, as sent (for the floor server to repeat)."""
    r = requests.get(
        path,
        params={"labelSelector": f"app={TARGET}"},
        headers={"Accept-Encoding": "gzip", **dict(AS_HPA[:2])},
        cert=str(client_pem),
        verify=str(ca),
        timeout=CLIENT_TIMEOUT,
        stream=True,
    )
    if r.status_code != 200 or r.headers.get("Content-Encoding") != "gzip":
        raise RuntimeError(f"the adapter's answer for the floor: HTTP {r.status_code}, not gzip")
    target = root / "answer.json.gz"
    target.write_bytes(r.raw.read(decode_content=False))
    return target


def _start_floor(root: Path, cert: Path, key: Path, client_ca: Path, body: Path) -> Floor:
    port = free_port()
    cmd = [sys.executable, "-m", "bench.tls_floor", str(port), str(cert), str(key), str(client_ca), str(body)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=(root / "floor.log").open("w"))
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != b"ready":
        raise RuntimeError(f"the floor server did not start: {(root / 'floor.log').read_text()[-2000:]}")
    return Floor(proc, f"https://127.0.0.1:{port}/floor")


def _cpu(ps: psutil.Process | None) -> float:
    if ps is None:
        return 0.0
    t = ps.cpu_times()
    return float(t.user + t.system)


def memory_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of a process in MiB."""
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(rest.split()[0]) / 1024
    return found.get("VmRSS", float("nan")), found.get("VmHWM", float("nan"))


def prometheus_queries(url: str) -> float:
    """Instant queries Prometheus has answered (its own counter, all status codes)."""
    text = requests.get(f"{url}/metrics", timeout=10).text
    pattern = r'^prometheus_http_requests_total\{[^}]*handler="/api/v1/query"[^}]*\} (\S+)$'
    return sum(float(v) for v in re.findall(pattern, text, re.MULTILINE))


def histogram_buckets(text: str, name: str, selector: str) -> dict[str, float]:
    """``le`` → cumulative count of one histogram child in a Prometheus exposition."""
    pattern = rf"^{name}_bucket\{{([^}}]*)\}} (\S+)$"
    out = {}
    for labels, value in re.findall(pattern, text, re.MULTILINE):
        if selector in labels:
            le = re.search(r'le="([^"]+)"', labels)
            if le:
                out[le.group(1)] = float(value)
    return out


def within(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Share of the requests between two bucket readings handled within each bound, by bound in ms."""
    total = after.get("+Inf", 0.0) - before.get("+Inf", 0.0)
    if total <= 0:
        return {}
    shares = {}
    for le in ("0.001", "0.0025", "0.005", "0.01"):
        if le in after:
            shares[f"{float(le) * 1000:g}"] = round((after[le] - before.get(le, 0.0)) / total, 4)
    return shares


def run(*, seconds: float = 20.0, pods: int = 50_000, workdir: Path | None = None) -> dict[str, object]:
    own_dir = workdir is None
    root = Path(tempfile.mkdtemp(prefix="gpupilot-bench-adapter-")) if workdir is None else workdir
    try:
        return _run(root, seconds, pods)
    finally:
        if own_dir:
            shutil.rmtree(root, ignore_errors=True)


def _run(root: Path, seconds: float, total_pods: int) -> dict[str, object]:
    t0 = time.time()
    history = root / "history.om.txt"
    prom_pods = write_history(history, now=t0)
    backfill_openmetrics(history, root / "data", block_duration="2h")
    history.unlink()
    setup_s = time.time() - t0
    ca, cert, key, client_pem, front_proxy_ca = _mint_tls(root)
    names = pod_names()
    pods_api = PodsApi(total_pods)
    with PrometheusServer(root / "data") as prom:
        port = free_port()
        cmd = [
            *(sys.executable, "-m", "adapter", "serve", "--prometheus-url", prom.url),
            *("--secure-port", str(port), "--bind-address", "127.0.0.1"),
            *("--tls-cert-file", str(cert), "--tls-private-key-file", str(key)),
            *("--requestheader-client-ca-file", str(front_proxy_ca)),
            *("--requestheader-allowed-names", FRONT_PROXY_CN, "--authentication-skip-lookup"),
            *("--authorization-mode", "subjectaccessreview"),
            *("--pod-source", "kubernetes", "--kubeconfig", str(pods_api.kubeconfig(root / "kubeconfig"))),
            *("--refresh-interval", "15"),  # --max-connections: the default, 512
        ]
        env = {**os.environ, "MALLOC_ARENA_MAX": "2"}  # as deploy/adapter sets it
        log_path = root / "adapter.log"
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log_path.open("w"), env=env)
        floor: Floor | None = None
        try:
            base = f"https://127.0.0.1:{port}"
            started = time.time()
            deadline = started + 180
            while time.time() < deadline:
                try:
                    if requests.get(f"{base}/readyz", verify=str(ca), timeout=2).status_code == 200:
                        break
                except requests.RequestException:
                    pass
                if proc.poll() is not None:
                    raise RuntimeError(f"the adapter exited: {log_path.read_text()[-2000:]}")
                time.sleep(0.2)
            else:
                raise RuntimeError(f"the adapter was not ready within 180 s: {log_path.read_text()[-2000:]}")
            sync_s = time.time() - started
            rss_synced, _ = memory_mib(proc.pid)
            path = f"{base}/apis/custom.metrics.k8s.io/v1beta2/namespaces/{NAMESPACE}/pods/*/DCGM_FI_DEV_GPU_UTIL"

            def adapter_call(selector: str, expect: int) -> Call:
                def call(s: requests.Session) -> Check:
                    r = s.get(
                        path,
                        params={"labelSelector": selector},
                        headers=dict(AS_HPA[:2]),
                        cert=str(client_pem),
                        verify=str(ca),
                        timeout=CLIENT_TIMEOUT,
                    )

                    def check() -> str | None:
                        if r.status_code != 200:
                            return f"HTTP {r.status_code}"
                        got = len(r.json()["items"])
                        return None if got == expect else f"{got} items, wanted {expect}"

                    return check

                return call

            def regex_query(group: list[str]) -> str:
                return (
                    f'sum(DCGM_FI_DEV_GPU_UTIL{{namespace="{NAMESPACE}",pod=~"{"|".join(group)}"}}) by (pod)'
                )

            def regex_url(group: list[str]) -> str:
                return f"{prom.url}/api/v1/query?" + urllib.parse.urlencode({"query": regex_query(group)})

            tls = ssl.create_default_context(cafile=str(ca))
            tls.load_cert_chain(str(client_pem))

            def adapter_target(selector: str, expect: int) -> Target:
                return Target(path, expect, b'"describedObject"', {"labelSelector": selector}, tls, AS_HPA)

            def baseline_target(group: list[str], expect: int) -> Target:
                query = {"query": regex_query(group)}
                return Target(f"{prom.url}/api/v1/query", expect, b'"metric":', query)

            def baseline_call(url: str, expect: int) -> Call:
                def call(s: requests.Session) -> Check:
                    r = s.get(url, timeout=CLIENT_TIMEOUT)

                    def check() -> str | None:
                        if r.status_code != 200:
                            return f"HTTP {r.status_code}"
                        got = len(r.json()["data"]["result"])
                        return None if got == expect else f"{got} series, wanted {expect}"

                    return check

                return call

            all_pods = [n for group in names.values() for n in group]
            url_500, url_5000 = regex_url(names[TARGET]), regex_url(all_pods)
            hpa_500 = adapter_call(f"app={TARGET}", PODS_PER_DEPLOYMENT)
            hpa_5000 = adapter_call("tier=gpu", prom_pods)
            target_500 = adapter_target(f"app={TARGET}", PODS_PER_DEPLOYMENT)
            warm = requests.Session()  # the first ask of each query is evaluated synchronously
            for check in (hpa_500, hpa_5000):
                if (why := check(warm)()) is not None:
                    raise RuntimeError(f"warm-up request failed: {why}; see {log_path}")
            adapter_ps = psutil.Process(proc.pid)

            def server_buckets() -> dict[str, float]:
                text = requests.get(
                    f"{base}/metrics",
                    headers=dict(AS_HPA[:2]),
                    cert=str(client_pem),
                    verify=str(ca),
                    timeout=CLIENT_TIMEOUT,
                ).text
                return histogram_buckets(text, "gpupilot_adapter_request_duration_seconds", 'kind="custom"')

            prom_ps = psutil.Process(prom._proc.pid) if prom._proc is not None else None
            floor = _start_floor(root, cert, key, front_proxy_ca, _gzip_answer(path, client_pem, ca, root))
            floor_ps = psutil.Process(floor.proc.pid)
            floor_target = Target(floor.url, PODS_PER_DEPLOYMENT, b'"describedObject"', {}, tls, AS_HPA)
            scenarios: list[Callable[[], Result]] = [
                lambda: serial("gpupilot hpa-500 serial", SERIAL_REQUESTS, hpa_500),
                lambda: serial(
                    "baseline regex-500 serial", SERIAL_REQUESTS, baseline_call(url_500, PODS_PER_DEPLOYMENT)
                ),
            ]
            for rate in RATES_500:
                scenarios += [
                    lambda rate=rate: open_loop("gpupilot hpa-500", rate, seconds, target_500),  # type: ignore[misc]
                    *(  # right after the adapter's, on the machine as it is then
                        [lambda: open_loop(FLOOR, 100.0, seconds, floor_target)] if rate == 100.0 else []
                    ),
                    lambda rate=rate: open_loop(  # type: ignore[misc]
                        "baseline regex-500 (GET)",
                        rate,
                        seconds,
                        baseline_target(names[TARGET], PODS_PER_DEPLOYMENT),
                    ),
                ]
            scenarios += [
                lambda: open_loop(
                    "gpupilot hpa-5000", RATE_5000, seconds, adapter_target("tier=gpu", prom_pods)
                ),
                lambda: open_loop(
                    "baseline regex-5000 (GET)", RATE_5000, seconds, baseline_target(all_pods, prom_pods)
                ),
            ]
            results = []
            for scenario in scenarios:
                sys_before = adapter_ps.cpu_times().system
                floor_before = _cpu(floor_ps)
                before = (
                    _cpu(adapter_ps),
                    _cpu(prom_ps),
                    prometheus_queries(prom.url),
                    time.perf_counter(),
                    server_buckets(),
                )
                result = scenario()
                result.seconds = time.perf_counter() - before[3]
                result.adapter_cpu_s = _cpu(adapter_ps) - before[0]
                result.adapter_sys_s = adapter_ps.cpu_times().system - sys_before
                if result.name == FLOOR:  # its "adapter CPU" column is the floor server's
                    result.adapter_cpu_s = _cpu(floor_ps) - floor_before
                    result.adapter_sys_s = 0.0
                result.prometheus_cpu_s = _cpu(prom_ps) - before[1]
                result.prometheus_queries = prometheus_queries(prom.url) - before[2]
                result.adapter_peak_rss_mib = memory_mib(proc.pid)[1]
                result.server_within_ms = within(before[4], server_buckets())
                results.append(result)
            _, peak_before_slow = memory_mib(proc.pid)

            def real_request() -> str | None:
                return hpa_500(requests.Session())()

            slow = slow_connections(port, SLOW_CONNECTIONS, real_request, pid=proc.pid)
            rss_now, peak = memory_mib(proc.pid)
        finally:
            for running in (proc, *((floor.proc,) if floor is not None else ())):
                running.send_signal(signal.SIGTERM)
                try:
                    running.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    running.kill()
            pods_api.close()
    rows = [r.row() for r in results]
    by_key = {(str(r["scenario"]), r["rate_per_s"]): r for r in rows}
    ours_100, ours_10 = by_key[("gpupilot hpa-500", 100.0)], by_key[("gpupilot hpa-500", 10.0)]
    floor_100 = by_key[(FLOOR, 100.0)]
    base_100, base_10 = (
        by_key[("baseline regex-500 (GET)", 100.0)],
        by_key[("baseline regex-500 (GET)", 10.0)],
    )
    return {
        "pods_in_prometheus": prom_pods,
        "pods_in_cluster": len(pods_api.pods),
        "pod_list_pages": pods_api.pages,
        "subject_access_reviews": pods_api.reviews,
        "adapter_ready_seconds": round(sync_s, 1),
        "setup_seconds": round(setup_s, 1),
        "seconds_per_scenario": seconds,
        "baseline_url_bytes": {"regex-500": len(url_500), "regex-5000": len(url_5000)},
        "adapter_rss_mib_after_pod_sync": round(rss_synced, 1),
        "adapter_peak_rss_mib_before_slow_connections": round(peak_before_slow, 1),
        "adapter_peak_rss_mib": round(peak, 1),
        "adapter_rss_mib_at_end": round(rss_now, 1),
        "slow_connections": slow,
        "cpus": os.cpu_count(),
        "load_average_1m_at_end": round(os.getloadavg()[0], 1),
        "scenarios": rows,
        "prometheus_queries_per_s": {
            "gpupilot": {
                "10/s": ours_10["prometheus_queries_per_s"],
                "100/s": ours_100["prometheus_queries_per_s"],
            },
            "baseline": {
                "10/s": base_10["prometheus_queries_per_s"],
                "100/s": base_100["prometheus_queries_per_s"],
            },
        },
        "goals": {
            "p99_ms_at_100_per_s": ours_100["p99_ms"],
            "p99_goal_met": bool(ours_100["p99_ms"] <= 10),  # type: ignore[operator]
            "adapter_cpu_ms_per_500_pod_answer": ours_100["adapter_cpu_ms_per_request"],
            "cpu_goal_met": bool(ours_100["adapter_cpu_ms_per_request"] <= 1),  # type: ignore[operator]
            "floor_cpu_ms_per_request": floor_100["adapter_cpu_ms_per_request"],
            "adapter_own_cpu_ms_per_answer": round(
                ours_100["adapter_cpu_ms_per_request"] - floor_100["adapter_cpu_ms_per_request"],  # type: ignore[operator]
                3,
            ),
            "prometheus_load_flat": bool(
                ours_100["prometheus_queries_per_s"] <= ours_10["prometheus_queries_per_s"] + 0.5  # type: ignore[operator]
            ),
            "rss_goal_met": rss_synced <= 150 and peak_before_slow <= 150,
            "slow_connections_goal_met": bool(
                slow["held"] >= SLOW_CONNECTIONS and peak <= DEPLOYMENT_LIMIT_MIB and slow["requests_ok"]
            ),
            "zero_failures": not any(
                r["failures"] for r in rows if str(r["scenario"]).startswith("gpupilot")
            ),
        },
    }


def slow_connections(
    port: int, count: int, real_request: Callable[[], str | None], *, pid: int
) -> dict[str, object]:
    """Open ``count`` connections that start a TLS record and stall; while they are held (until the
    handshake deadline), time real requests."""
    held: list[socket.socket] = []
    try:
        for _ in range(count):
            try:
                s = socket.create_connection(("127.0.0.1", port), timeout=5)
                s.sendall(b"\x16\x03\x01\x02\x00")  # a handshake record header promising 512 bytes
                held.append(s)
            except OSError:
                break
        time.sleep(2.0)  # let the adapter accept what it will
        rss = memory_mib(pid)[0]
        adapter = psutil.Process(pid)
        threads = adapter.num_threads()
        accepted = sum(1 for c in adapter.net_connections("tcp") if c.status == psutil.CONN_ESTABLISHED)
        latencies, ok = [], True
        for _ in range(10):
            t0 = time.perf_counter()
            ok = ok and real_request() is None
            latencies.append((time.perf_counter() - t0) * 1000)
    finally:
        for s in held:
            s.close()
    return {
        "held": len(held),
        "accepted_by_adapter": accepted,
        "rss_mib": round(rss, 1),
        "adapter_threads": threads,
        "requests_ok": ok,
        "request_ms_max": round(max(latencies), 1),
    }


def render(res: dict[str, object]) -> str:
    lines = [
        f"adapter benchmark: {res['pods_in_prometheus']} pods in Prometheus, {res['pods_in_cluster']} in the "
        f"cluster ({res['pod_list_pages']} list pages), {res['seconds_per_scenario']} s per scenario, "
        f"{res['cpus']} CPUs, load average {res['load_average_1m_at_end']} at the end",
        f"{'scenario':<28}{'rate/s':>7}{'ok':>7}{'fail':>6}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}"
        f"{'adapter CPU ms/req':>20}{'prom CPU ms/req':>17}{'prom queries/s':>16}{'adapter peak MiB':>18}",
    ]
    for r in res["scenarios"]:  # type: ignore[attr-defined]
        fails = sum(r["failures"].values())
        rate = f"{r['rate_per_s']:g}" if r["rate_per_s"] else "serial"
        lines.append(
            f"{r['scenario']:<28}{rate:>7}{r['ok']:>7}{fails:>6}{r['p50_ms']:>9}{r['p99_ms']:>9}{r['max_ms']:>9}"
            f"{r['adapter_cpu_ms_per_request']:>20}{r['prometheus_cpu_ms_per_request']:>17}"
            f"{r['prometheus_queries_per_s']:>16}{r['adapter_peak_rss_mib']:>18}"
        )
        if r["failures"]:
            lines.append(f"    failures: {r['failures']}")
        if r["adapter_handled_within_ms"]:
            shares = ", ".join(f"{v:.2%} ≤ {k} ms" for k, v in r["adapter_handled_within_ms"].items())
            lines.append(f"    handled in the adapter: {shares}")
            lines.append(
                f"    adapter CPU of which system (kernel): {r['adapter_system_ms_per_request']} ms/req"
            )
    lines.append(f"Prometheus queries/s: {res['prometheus_queries_per_s']}")
    lines.append(
        f"SubjectAccessReviews sent by the adapter over the whole run: {res['subject_access_reviews']} "
        "(verdicts cached 10 s)"
    )
    lines.append(f"baseline GET URL bytes: {res['baseline_url_bytes']}")
    lines.append(
        f"adapter RSS: {res['adapter_rss_mib_after_pod_sync']} MiB after listing {res['pods_in_cluster']} pods "
        f"(ready in {res['adapter_ready_seconds']} s), peak {res['adapter_peak_rss_mib_before_slow_connections']} "
        f"MiB before the slow connections, {res['adapter_peak_rss_mib']} MiB after"
    )
    lines.append(f"slow connections: {res['slow_connections']}")
    lines.append(f"goals: {res['goals']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.adapter", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="duration of each scenario (default 20)")
    parser.add_argument(
        "--pods", type=int, default=50_000, help="pods in the cluster's pod list (default 50000)"
    )
    parser.add_argument("--json", type=Path, help="also write the figures as JSON here")
    args = parser.parse_args(argv)
    res = run(seconds=args.seconds, pods=args.pods)
    print(render(res))
    if args.json:
        args.json.write_text(json.dumps(res, indent=2))
    goals = res["goals"]
    missed = [k for k, v in goals.items() if k.endswith(("_met", "_flat", "failures")) and not v]  # type: ignore[attr-defined]
    if missed:
        print(f"goals missed on this machine: {', '.join(missed)} (see the load average above)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
