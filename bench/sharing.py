"""Exporter on shared GPUs: per-pod figures (per-process accounting) beside today's exporter without them.

Node: 8 whole GPUs, each time-sliced between 8 pods (64 containers), 100 GPU processes. Snapshots
are built in memory (the per-process NVML calls are two per GPU and are not measured here: there is
no driver on this machine); PID → container runs over a real tree of files in a temporary
directory (``/proc/<pid>/cgroup`` and ``/var/log/containers``), as on a node.

* per-process collection: CPU per collection with the per-pod families (``/proc`` reads, the
  container listing, shares, their series in the page) minus the same collection without them,
  as a share of one core at a 10 s interval. Goal ≤ 1 %.
* scrape: server CPU per scrape, and scrape latency, of a page carrying the per-pod series, beside
  the page without them (16 scrapers, as ``bench.exporter``). Goal ≤ 100 µs CPU per scrape.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import MappingProxyType

from bench.exporter import load_test, markdown_table, process_cpu_s

HERE = Path(__file__).resolve().parent
GPUS, PODS_PER_GPU, PROCESSES = 8, 8, 100
INTERVAL_S = 10.0
MIB = 1024 * 1024


def _cid(n: int) -> str:
    return f"{n:064x}"


def build_node(root: Path):
    """(snapshot, allocations, ContainerIndex) of the benchmark node, its file tree under ``root``."""
    from exporter.attribute.procs import ContainerIndex  # noqa: PLC0415
    from exporter.snapshot import GpuInfo, GpuSnapshot, NodeSnapshot, PodRef, ProcessUsage  # noqa: PLC0415

    proc, logs = root / "proc", root / "containers"
    logs.mkdir(parents=True, exist_ok=True)
    gpus = []
    allocations: dict[str, tuple[PodRef, ...]] = {}
    pid = 1000
    for g in range(GPUS):
        uuid = f"GPU-bench-{g:04d}-0000-0000-000000000000"
        holders = []
        processes = []
        count = PROCESSES // GPUS + (1 if g < PROCESSES % GPUS else 0)
        for k in range(count):
            pod_no = g * PODS_PER_GPU + k % PODS_PER_GPU
            pod, cid = f"infer-{pod_no:03d}", _cid(pod_no + 1)
            if k < PODS_PER_GPU:
                holders.append(PodRef("serve", pod, "server", "nvidia.com/gpu"))
                (logs / f"{pod}_serve_server-{cid}.log").symlink_to("/nonexistent")
            pid += 1
            (proc / str(pid)).mkdir(parents=True)
            (proc / str(pid) / "cgroup").write_text(
                f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{pod_no}.slice/"
                f"cri-containerd-{cid}.scope\n"
            )
            processes.append(ProcessUsage(pid, memory_bytes=(2000 + 10 * k) * MIB, sm_util=5.0 + k))
        allocations[uuid] = tuple(holders)
        info = GpuInfo(
            index=g,
            uuid=uuid,
            pci_bus_id=f"00000000:{0x18 + g:02X}:00.0",
            minor_number=g,
            model_name="NVIDIA H100 80GB HBM3",
            pci_device_id=0x2330,
            driver_version="550.127.05",
            mig_enabled=False,
            gpm_supported=True,
            memory_total_mib=81559,
        )
        values = {
            "DCGM_FI_DEV_GPU_UTIL": 90.0,
            "DCGM_FI_DEV_FB_USED": 60000.0,
            "DCGM_FI_DEV_FB_FREE": 21000.0,
            "DCGM_FI_DEV_POWER_USAGE": 500.0,
            "DCGM_FI_DEV_GPU_TEMP": 50.0,
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.9,
        }
        gpus.append(
            GpuSnapshot(
                info=info,
                values=MappingProxyType(values),
                compute_processes=count,
                processes=tuple(processes),
            )
        )
    snap = NodeSnapshot(taken_at=time.time(), gpus=tuple(gpus), processes_visible=True)
    return snap, allocations, ContainerIndex(proc_root=proc, container_logs=logs)


class _Fixed:
    name = "bench"

    def __init__(self, snap: object) -> None:
        self.snap = snap

    def open(self) -> None:
        pass

    def read(self) -> object:
        return self.snap

    def close(self) -> None:
        pass


def make_collector(root: Path, *, sharing: bool):
    from exporter.collect.collector import Collector  # noqa: PLC0415
    from exporter.settings import CollectorSettings  # noqa: PLC0415

    snap, allocations, index = build_node(root)
    return Collector(
        _Fixed(snap),  # type: ignore[arg-type]
        hostname="bench-node",
        settings=CollectorSettings(interval=INTERVAL_S),
        allocations=lambda: allocations,
        process_owners=index.owners if sharing else None,
    )


def collection_cpu(collections: int) -> dict[str, float]:
    out = {}
    for sharing in (False, True):
        with tempfile.TemporaryDirectory() as tmp:
            c = make_collector(Path(tmp), sharing=sharing)
            c.collect_once()
            t0 = time.process_time()
            for _ in range(collections):
                c.collect_once()
            out["with" if sharing else "without"] = (time.process_time() - t0) / collections
            out[("series_with" if sharing else "series_without")] = c.page.text.count(
                b"\n"
            ) - c.page.text.count(b"\n#")
            c.stop()
    return out


def serve(sharing: bool) -> None:
    from exporter.serve.server import MetricsServer  # noqa: PLC0415

    with tempfile.TemporaryDirectory() as tmp:
        c = make_collector(Path(tmp), sharing=sharing)
        c.collect_once()
        server = MetricsServer(c, host="127.0.0.1", port=0).start()
        print(f"PORT {server.port}", flush=True)
        sys.stdin.read()
        server.stop()
        c.stop()


def scrape(sharing: bool, seconds: float) -> dict[str, float]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.sharing", "--role", "serve", "--sharing", str(int(sharing))],
        cwd=HERE.parent,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline().split()[1])
        cpu0 = process_cpu_s(proc.pid)
        result = load_test(port, seconds)
        result["cpu_per_scrape_us"] = (process_cpu_s(proc.pid) - cpu0) / result["scrapes"] * 1e6
        return result
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=30)


def table(cpu: dict[str, float], with_: dict[str, float], without: dict[str, float]) -> str:
    extra = cpu["with"] - cpu["without"]
    share = extra / INTERVAL_S * 100
    rows = [
        ("series on the page", "—", f"{cpu['series_with']:.0f}", f"{cpu['series_without']:.0f}", None),
        ("CPU per collection", "—", f"{cpu['with'] * 1000:.2f} ms", f"{cpu['without'] * 1000:.2f} ms", None),
        (
            f"per-process collection, share of a core at {INTERVAL_S:g} s",
            "≤ 1 %",
            f"{share:.3f} %",
            "—",
            share <= 1.0,
        ),
        (
            "server CPU per scrape",
            "≤ 100 µs",
            f"{with_['cpu_per_scrape_us']:.0f} µs",
            f"{without['cpu_per_scrape_us']:.0f} µs",
            with_["cpu_per_scrape_us"] <= 100,
        ),
        (
            "scrape p99, 16 scrapers back to back",
            "—",
            f"{with_['p99_ms']:.2f} ms",
            f"{without['p99_ms']:.2f} ms",
            None,
        ),
    ]
    return markdown_table(("measure", "goal", "with per-pod figures", "today's exporter", "met"), rows)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.sharing", description=__doc__.splitlines()[0])
    p.add_argument(
        "--collections", type=int, default=2000, help="collections timed per variant (default 2000)"
    )
    p.add_argument(
        "--scrape-seconds", type=float, default=5.0, help="load-test length per variant (default 5)"
    )
    p.add_argument("--json", type=Path, help="also write the figures as JSON here")
    p.add_argument("--role", choices=("main", "serve"), default="main", help=argparse.SUPPRESS)
    p.add_argument("--sharing", type=int, default=1, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.role == "serve":
        serve(bool(args.sharing))
        return 0
    cpu = collection_cpu(args.collections)
    with_, without = scrape(True, args.scrape_seconds), scrape(False, args.scrape_seconds)
    print(
        f"node: {GPUS} time-sliced GPUs × {PODS_PER_GPU} pods, {PROCESSES} GPU processes; "
        f"{args.collections} collections, {args.scrape_seconds:g} s of scrapes per variant"
    )
    print(table(cpu, with_, without))
    if args.json:
        args.json.write_text(json.dumps({"collection": cpu, "with": with_, "without": without}, indent=2))
    extra = (cpu["with"] - cpu["without"]) / INTERVAL_S * 100
    return 0 if extra <= 1.0 and with_["cpu_per_scrape_us"] <= 100 else 1


if __name__ == "__main__":
    raise SystemExit(main())
