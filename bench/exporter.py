"""Exporter benchmark: gpupilot's pre-rendered exposition beside the usual prometheus_client pattern.

Node: ``bench/node-8xh100-56pods.yaml`` — 8 × H100 80GB, each 7 × 1g.10gb, 56 pods (one per slice).
Both exporters serve the same device data through the same backend: snapshots read from the
simulator up front and replayed, so the simulator's own cost is excluded from every figure (which
favours the baseline, whose per-scrape device reads become nearly free).

* gpupilot: ``Collector`` + ``MetricsServer`` — a scrape is a lookup in the pre-rendered page.
* baseline: a prometheus_client collector whose ``collect()`` reads the backend and builds families
  (the same :func:`device_families`), served by ``start_http_server`` — ``generate_latest`` per scrape.

Each server runs in its own process; 16 scrapers (4 processes × 4 threads, raw sockets, keep-alive
where the server allows it, ``Accept-Encoding: gzip`` as Prometheus sends) hammer it for a fixed time.
Then a soak process runs 10,000 collections back to back with the server up, measuring CPU per
collection and RSS. ``python -m bench.exporter --help`` for shorter runs.
"""

from __future__ import annotations

import argparse
import copyreg
import json
import os
import pickle
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

HERE = Path(__file__).resolve().parent
SCENARIO = HERE / "node-8xh100-56pods.yaml"
NODE = "bench-node"
CONCURRENCY = 16
CLIENT_PROCESSES = 4
PACED_PERIOD_S = 0.05
"""Paced load: each of the 16 scrapers scrapes every 50 ms (320 scrapes/s in all; Prometheus
scrapes a target every 10–60 s), so latency is measured below saturation too."""
REQUEST = (
    b"GET /metrics HTTP/1.1\r\nHost: bench\r\nUser-Agent: bench\r\n"
    b"Accept: text/plain;version=0.0.4;q=1,*/*;q=0.1\r\nAccept-Encoding: gzip\r\n\r\n"
)


def _proxy(d: dict[str, Any]) -> MappingProxyType[str, Any]:
    return MappingProxyType(d)


# Snapshots hold read-only mappings; pickle them as dicts (both ends run this module as __main__).
copyreg.pickle(MappingProxyType, lambda m: (_proxy, (dict(m),)))


# -- shared data --------------------------------------------------------------------------------
def make_data(path: Path, count: int = 30) -> None:
    """Read ``count`` snapshots 10 s apart from the simulator, plus its allocations; pickle them."""
    from simulator import scenario as scenario_mod  # noqa: PLC0415
    from simulator.backend import SimBackend  # noqa: PLC0415

    scenario = scenario_mod.load(SCENARIO)
    backend = SimBackend(scenario, node=NODE)
    start = scenario.epoch + 9 * 3600
    snaps = [backend.snapshot_at(start + 10 * i) for i in range(count)]
    allocations = dict(backend.allocations())
    path.write_bytes(pickle.dumps((snaps, allocations)))


class ReplayBackend:
    """The snapshots, in a loop: a backend whose read costs nothing, so only the exporter is measured."""

    name = "replay"

    def __init__(self, snaps: Sequence[Any]) -> None:
        self._snaps = list(snaps)
        self._i = 0

    def open(self) -> None:
        pass

    def read(self) -> Any:
        snap = self._snaps[self._i % len(self._snaps)]
        self._i += 1
        return snap

    def close(self) -> None:
        pass


def load_data(path: Path) -> tuple[ReplayBackend, dict[str, Any]]:
    snaps, allocations = pickle.loads(path.read_bytes())
    return ReplayBackend(snaps), allocations


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process, all threads (``/proc/PID/stat``)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


# -- server roles (child processes) -------------------------------------------------------------
def serve_ours(data: Path) -> None:
    from exporter.collect.collector import Collector  # noqa: PLC0415
    from exporter.serve.server import MetricsServer  # noqa: PLC0415
    from exporter.settings import CollectorSettings  # noqa: PLC0415

    backend, allocations = load_data(data)
    collector = Collector(
        backend,
        hostname=NODE,
        settings=CollectorSettings(interval=10.0),
        allocations=lambda: allocations,
    )
    collector.start()  # collects every 10 s, as in production
    server = MetricsServer(collector, host="127.0.0.1", port=0).start()
    print(f"PORT {server.port}", flush=True)
    sys.stdin.read()  # until the parent closes our stdin


def serve_baseline(data: Path) -> None:
    from prometheus_client import start_http_server  # noqa: PLC0415
    from prometheus_client.core import Metric  # noqa: PLC0415
    from prometheus_client.registry import CollectorRegistry  # noqa: PLC0415

    from exporter.expose.exposition import device_families  # noqa: PLC0415

    backend, allocations = load_data(data)

    class DeviceCollector:
        """The usual pattern: read the devices inside collect(), build fresh families each scrape."""

        def collect(self) -> Iterator[Metric]:
            snap = backend.read()
            for fam in device_families(snap, hostname=NODE, allocations=allocations):
                metric = Metric(fam.name, fam.help, "counter" if fam.kind == "counter" else "gauge")
                for labels, value in fam.samples:
                    metric.add_sample(fam.name, dict(labels), value)
                yield metric

    registry = CollectorRegistry()
    registry.register(DeviceCollector())
    server, _ = start_http_server(0, addr="127.0.0.1", registry=registry)
    print(f"PORT {server.server_port}", flush=True)
    sys.stdin.read()


def soak(data: Path, collections: int) -> None:
    from exporter.collect.collector import Collector  # noqa: PLC0415
    from exporter.serve.server import MetricsServer  # noqa: PLC0415
    from exporter.settings import CollectorSettings  # noqa: PLC0415

    backend, allocations = load_data(data)
    collector = Collector(
        backend,
        hostname=NODE,
        settings=CollectorSettings(interval=10.0),
        allocations=lambda: allocations,
    )
    server = MetricsServer(collector, host="127.0.0.1", port=0).start()
    half = collections // 2
    cpu0 = time.process_time()
    rss_half = 0.0
    for i in range(collections):
        if not collector.collect_once():
            raise SystemExit(f"collection {i} failed: {collector.last_error}")
        if i + 1 == half:
            rss_half = rss_mib()
    cpu = time.process_time() - cpu0
    page = collector.page
    result = {
        "collections": collections,
        "cpu_per_collection_s": cpu / collections,
        "rss_half_mib": rss_half,
        "rss_end_mib": rss_mib(),
        "body_bytes": len(page.text),
        "body_gzip_bytes": len(page.body(openmetrics=False, gzip=True, now=time.monotonic())),
        "series": page.text.count(b"\n") - page.text.count(b"\n#"),
    }
    server.stop()
    print(json.dumps(result), flush=True)


# -- scrapers -----------------------------------------------------------------------------------
def _scrape_loop(port: int, start_at: float, duration: float, period: float, out: list[float]) -> None:
    """Scrape until ``duration`` is over: back to back (``period`` 0), or one scrape per ``period``."""
    sock: socket.socket | None = None
    buf = b""
    while time.time() < start_at:
        time.sleep(0.001)
    begin = time.perf_counter()
    end = begin + duration
    sent = 0
    while time.perf_counter() < end:
        if period:
            due = begin + sent * period
            if due > time.perf_counter():
                time.sleep(due - time.perf_counter())
        sent += 1
        t0 = time.perf_counter()
        if sock is None:
            sock = socket.create_connection(("127.0.0.1", port))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            buf = b""
        sock.sendall(REQUEST)
        while b"\r\n\r\n" not in buf:
            chunk = sock.recv(262144)
            if not chunk:
                raise RuntimeError("server closed the connection before answering")
            buf += chunk
        head, _, buf = buf.partition(b"\r\n\r\n")
        lower = head.lower()
        if not head.startswith(b"HTTP/1.1 200") and not head.startswith(b"HTTP/1.0 200"):
            raise RuntimeError(head.split(b"\r\n")[0].decode())
        length = -1
        for line in lower.split(b"\r\n"):
            if line.startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        closing = b"connection: close" in lower or head.startswith(b"HTTP/1.0")
        if length >= 0:
            while len(buf) < length:
                chunk = sock.recv(262144)
                if not chunk:
                    raise RuntimeError("short body")
                buf += chunk
            buf = buf[length:]
        else:
            while sock.recv(262144):
                pass
            closing = True
        out.append(time.perf_counter() - t0)
        if closing:
            sock.close()
            sock = None
    if sock is not None:
        sock.close()


def client(port: int, threads: int, start_at: float, duration: float, period: float) -> None:
    # A scraper thread whose answer has arrived must not wait up to 5 ms (CPython's default switch
    # interval) for another scraper thread to release the GIL: that would be the client's delay.
    sys.setswitchinterval(0.0001)
    results: list[list[float]] = [[] for _ in range(threads)]
    workers = [
        threading.Thread(target=_scrape_loop, args=(port, start_at, duration, period, results[i]))
        for i in range(threads)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    print(json.dumps([x for r in results for x in r]), flush=True)


def load_test(port: int, duration: float, *, period: float = 0.0) -> dict[str, float]:
    start_at = time.time() + 1.0
    per_process = CONCURRENCY // CLIENT_PROCESSES
    procs = [
        subprocess.Popen(
            [
                *(sys.executable, "-m", "bench.exporter", "--role", "client", "--port", str(port)),
                *("--threads", str(per_process), "--start-at", repr(start_at)),
                *("--scrape-seconds", str(duration), "--period", repr(period)),
            ],
            cwd=HERE.parent,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(CLIENT_PROCESSES)
    ]
    latencies: list[float] = []
    for p in procs:
        out, _ = p.communicate(timeout=duration + 120)
        if p.returncode != 0:
            raise RuntimeError(f"scraper process failed with {p.returncode}")
        latencies.extend(json.loads(out))
    latencies.sort()
    n = len(latencies)
    return {
        "scrapes": n,
        "per_second": n / duration,
        "p50_ms": latencies[n // 2] * 1000,
        "p99_ms": latencies[min(n - 1, int(n * 0.99))] * 1000,
    }


def run_server(role: str, data: Path, duration: float) -> dict[str, float]:
    """Closed-loop load (saturation), then the paced load; figures of both in one dict."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.exporter", "--role", role, "--data", str(data)],
        cwd=HERE.parent,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("PORT "):
            raise RuntimeError(f"{role} server did not start: {line!r}")
        port = int(line.split()[1])
        cpu0 = process_cpu_s(proc.pid)
        result = load_test(port, duration)
        result["cpu_per_scrape_ms"] = (process_cpu_s(proc.pid) - cpu0) / result["scrapes"] * 1000
        paced = load_test(port, duration, period=PACED_PERIOD_S)
        result.update({f"paced_{k}": v for k, v in paced.items()})
        return result
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=30)


# -- report -------------------------------------------------------------------------------------
def table(
    ours: dict[str, float], base: dict[str, float], soak_result: dict[str, float], interval: float
) -> str:
    cpu_pct = soak_result["cpu_per_collection_s"] / interval * 100
    growth = soak_result["rss_end_mib"] - soak_result["rss_half_mib"]
    speedup = ours["per_second"] / base["per_second"]
    rows = [
        (
            "scrape p50, 16 scrapers back to back",
            "—",
            f"{ours['p50_ms']:.2f} ms",
            f"{base['p50_ms']:.2f} ms",
            f"{base['p50_ms'] / ours['p50_ms']:.0f}× faster",
            None,
        ),
        (
            "scrape p99, 16 scrapers back to back",
            "≤ 2 ms",
            f"{ours['p99_ms']:.2f} ms",
            f"{base['p99_ms']:.2f} ms",
            f"{base['p99_ms'] / ours['p99_ms']:.0f}× faster",
            ours["p99_ms"] <= 2.0,
        ),
        (
            "scrapes per second, 16 back to back",
            "≥ 20× baseline",
            f"{ours['per_second']:.0f}",
            f"{base['per_second']:.0f}",
            f"{speedup:.0f}×",
            speedup >= 20,
        ),
        (
            f"scrape p99, 16 scrapers × {1 / PACED_PERIOD_S:.0f}/s each",
            "≤ 2 ms",
            f"{ours['paced_p99_ms']:.2f} ms",
            f"{base['paced_p99_ms']:.2f} ms",
            f"{base['paced_p99_ms'] / ours['paced_p99_ms']:.0f}× faster",
            ours["paced_p99_ms"] <= 2.0,
        ),
        (
            "server CPU per scrape (any load)",
            "—",
            f"{ours['cpu_per_scrape_ms']:.3f} ms",
            f"{base['cpu_per_scrape_ms']:.1f} ms",
            f"{base['cpu_per_scrape_ms'] / ours['cpu_per_scrape_ms']:.0f}× less",
            None,
        ),
        (
            "exporter CPU per collection",
            "—",
            f"{soak_result['cpu_per_collection_s'] * 1000:.1f} ms",
            "—",
            "—",
            None,
        ),
        (
            f"CPU at a {interval:g} s interval",
            "≤ 1 % of a core",
            f"{cpu_pct:.2f} %",
            "—",
            "—",
            cpu_pct <= 1.0,
        ),
        (
            f"RSS after {soak_result['collections']:,} collections",
            "≤ 60 MiB",
            f"{soak_result['rss_end_mib']:.1f} MiB",
            "—",
            "—",
            soak_result["rss_end_mib"] <= 60,
        ),
        (
            f"RSS growth over the last {soak_result['collections'] // 2:,}",
            "< 1 MiB",
            f"{growth:+.2f} MiB",
            "—",
            "—",
            growth < 1.0,
        ),
    ]
    return markdown_table(("measure", "goal", "gpupilot", "baseline", "ratio", "met"), rows)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table with padded columns; each row's last cell says whether the goal was met
    (True, False, or None where there is no goal)."""
    cells = [tuple(header)] + [(*r[:-1], "—" if r[-1] is None else ("yes" if r[-1] else "NO")) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(header))]
    lines = ["| " + " | ".join(c[i].ljust(widths[i]) for i in range(len(header))) + " |" for c in cells]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.exporter", description=__doc__.splitlines()[0])
    p.add_argument(
        "--scrape-seconds", type=float, default=5.0, help="load-test length per exporter (default 5)"
    )
    p.add_argument(
        "--collections", type=int, default=10_000, help="soak length in collections (default 10000)"
    )
    p.add_argument("--json", type=Path, help="also write the figures as JSON here")
    p.add_argument("--role", choices=("ours", "baseline", "client", "soak"), help=argparse.SUPPRESS)
    p.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--threads", type=int, default=4, help=argparse.SUPPRESS)
    p.add_argument("--start-at", type=float, default=0.0, help=argparse.SUPPRESS)
    p.add_argument("--period", type=float, default=0.0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.role == "ours":
        serve_ours(args.data)
        return 0
    if args.role == "baseline":
        serve_baseline(args.data)
        return 0
    if args.role == "client":
        client(args.port, args.threads, args.start_at, args.scrape_seconds, args.period)
        return 0
    if args.role == "soak":
        soak(args.data, args.collections)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "snapshots.pickle"
        make_data(data)
        print(
            f"node: 8 × H100 80GB, 7 × 1g.10gb each, 56 pods ({SCENARIO.name}); "
            f"{CONCURRENCY} scrapers for {args.scrape_seconds:g} s per exporter",
            flush=True,
        )
        ours = run_server("ours", data, args.scrape_seconds)
        base = run_server("baseline", data, args.scrape_seconds)
        res = subprocess.run(
            [
                *(sys.executable, "-m", "bench.exporter", "--role", "soak", "--data", str(data)),
                *("--collections", str(args.collections)),
            ],
            cwd=HERE.parent,
            capture_output=True,
            text=True,
            check=False,
        )
        if res.returncode != 0:
            print(res.stderr, file=sys.stderr)
            return 1
        soak_result = json.loads(res.stdout.strip().splitlines()[-1])
    print(
        f"exposition: {soak_result['series']} series, {soak_result['body_bytes'] / 1024:.0f} KiB text, "
        f"{soak_result['body_gzip_bytes'] / 1024:.0f} KiB gzip; "
        f"scrapes: gpupilot {ours['scrapes']:.0f}, baseline {base['scrapes']:.0f}"
    )
    print(table(ours, base, soak_result, 10.0))
    load1, _, _ = os.getloadavg()
    print(
        f"machine: {os.cpu_count()} CPUs, load average {load1:.1f} at the end of the run "
        "(latencies include waiting for a CPU; CPU-per-scrape figures do not)"
    )
    if args.json:
        args.json.write_text(json.dumps({"gpupilot": ours, "baseline": base, "soak": soak_result}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
