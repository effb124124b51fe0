"""Per-pod figures on time-sliced GPUs: PID → container over a fake /proc and /var/log/containers
tree, shares that never add up to more than the device's own figure, and what NVML cannot see."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from exporter.attribute import procs, sharing
from exporter.collect.collector import Collector
from exporter.contract.layout import SeriesLayout
from exporter.settings import CollectorSettings
from exporter.snapshot import NodeSnapshot, PodRef, ProcessUsage
from tests.support.exporter import fakes

MIB = 1024 * 1024
IDS = {name: f"{i:x}" * 64 for i, name in enumerate(("a", "b", "c", "d"), start=10)}


def cgroup_v2_systemd(uid: str, cid: str) -> str:
    u = uid.replace("-", "_")
    return (
        "0::/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{u}.slice/cri-containerd-{cid}.scope\n"
    )


def cgroup_v1_cgroupfs(uid: str, cid: str) -> str:
    return (
        f"12:memory:/kubepods/besteffort/pod{uid}/{cid}\n11:cpu,cpuacct:/kubepods/besteffort/pod{uid}/{cid}\n"
    )


def fake_host(tmp_path: Path) -> procs.ContainerIndex:
    """Four GPU processes: three in pods (two containers of one pod), one on the host."""
    proc, logs = tmp_path / "proc", tmp_path / "containers"
    logs.mkdir()
    files = {
        101: cgroup_v2_systemd("1111-aaaa", IDS["a"]),
        102: cgroup_v1_cgroupfs("2222-bbbb", IDS["b"]),
        103: cgroup_v2_systemd("2222-bbbb", IDS["c"]),
        104: "0::/system.slice/nvidia-mps.service\n",
    }
    for pid, text in files.items():
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cgroup").write_text(text)
    for name in (
        f"infer-0_serve_server-{IDS['a']}.log",
        f"infer-1_serve_server-{IDS['b']}.log",
        f"infer-1_serve_sidecar-{IDS['c']}.log",
        f"other_kube-system_x-{IDS['d']}.log",
        "not-a-container-log.txt",
    ):
        (logs / name).symlink_to("/nonexistent")
    return procs.ContainerIndex(proc_root=proc, container_logs=logs)


def test_pids_map_to_their_containers_through_cgroup_and_log_names(tmp_path):
    index = fake_host(tmp_path)
    owners = index.owners([101, 102, 103, 104, 999])  # 999: ended since NVML listed it
    assert owners == {
        101: PodRef("serve", "infer-0", "server", ""),
        102: PodRef("serve", "infer-1", "server", ""),
        103: PodRef("serve", "infer-1", "sidecar", ""),
    }


def test_cgroup_parsing_covers_runtimes_and_ignores_host_processes():
    cid = "f" * 64
    assert procs.container_id_from_cgroup(f"0::/kubepods/pod1/{cid}\n") == cid
    assert procs.container_id_from_cgroup(f"0::/kubepods.slice/x/crio-{cid}.scope\n") == cid
    assert procs.container_id_from_cgroup(f"0::/kubepods.slice/x/docker-{cid}.scope\n") == cid
    assert procs.container_id_from_cgroup(f"0::/system.slice/docker-{cid}.scope\n") is None
    assert procs.container_id_from_cgroup("garbage") is None


def shared_gpu(*, util: float = 60.0, fb_mib: float = 10_000.0, visible: bool = True):
    gpu = fakes.whole_gpu(0, values={"DCGM_FI_DEV_GPU_UTIL": util, "DCGM_FI_DEV_FB_USED": fb_mib})
    return dataclasses.replace(
        gpu,
        processes=(
            ProcessUsage(101, memory_bytes=2_000 * MIB, sm_util=30.0),
            ProcessUsage(102, memory_bytes=3_000 * MIB, sm_util=50.0),
            ProcessUsage(103, memory_bytes=1_000 * MIB, sm_util=None),
            ProcessUsage(104, memory_bytes=500 * MIB, sm_util=None),  # MPS control daemon: no pod, no SMs
        ),
        process_util_visible=visible,
    )


OWNERS = {
    101: PodRef("serve", "infer-0", "server", ""),
    102: PodRef("serve", "infer-1", "server", ""),
    103: PodRef("serve", "infer-1", "sidecar", ""),
}


def test_shares_are_scaled_so_they_never_exceed_the_devices_figure():
    util, mem = sharing.gpu_pod_shares(shared_gpu(util=60.0, fb_mib=4_000.0), OWNERS)
    # 0.3 + 0.5 = 0.8 > 0.6: both scaled by 0.75
    assert util[("serve", "infer-0", "server")] == pytest.approx(0.225)
    assert util[("serve", "infer-1", "server")] == pytest.approx(0.375)
    assert sum(util.values()) == pytest.approx(0.6)
    assert sum(mem.values()) == pytest.approx(4_000 * MIB)
    # below the device's figure: unchanged
    util, mem = sharing.gpu_pod_shares(shared_gpu(util=95.0, fb_mib=10_000.0), OWNERS)
    assert util[("serve", "infer-0", "server")] == pytest.approx(0.30)
    assert mem[("serve", "infer-1", "sidecar")] == 1_000 * MIB


def test_invisible_per_process_utilisation_is_marked_and_left_out_not_zero():
    snap = NodeSnapshot(taken_at=1.0, gpus=(shared_gpu(visible=False),))
    fams = {f.name: f for f in sharing.pod_usage_families(snap, OWNERS, hostname="n", layout=SeriesLayout())}
    assert "gpupilot_pod_gpu_utilization_ratio" not in fams
    assert len(fams["gpupilot_pod_gpu_memory_used_bytes"].samples) == 3
    assert fams["gpupilot_gpu_process_utilization_visible"].samples[0][1] == 0.0


def test_utilisation_accounted_to_a_process_outside_every_pod_is_marked_not_visible():
    """Drivers that account MPS clients' work to the MPS server: the server (in no pod) holds the SM
    samples, the clients none. Their shares would read 0: they are left out and the GPU marked."""
    gpu = shared_gpu()
    mps = dataclasses.replace(
        gpu,
        processes=(
            ProcessUsage(101, memory_bytes=2_000 * MIB, sm_util=None),
            ProcessUsage(102, memory_bytes=3_000 * MIB, sm_util=None),
            ProcessUsage(104, memory_bytes=500 * MIB, sm_util=55.0),  # nvidia-cuda-mps-server
        ),
    )
    snap = NodeSnapshot(taken_at=1.0, gpus=(mps,))
    fams = {f.name: f for f in sharing.pod_usage_families(snap, OWNERS, hostname="n", layout=SeriesLayout())}
    assert "gpupilot_pod_gpu_utilization_ratio" not in fams
    assert fams["gpupilot_gpu_process_utilization_visible"].samples[0][1] == 0.0
    assert len(fams["gpupilot_pod_gpu_memory_used_bytes"].samples) == 2


def test_collector_publishes_per_pod_series_with_gpu_and_uuid(tmp_path):
    snap = NodeSnapshot(taken_at=1.0, gpus=(shared_gpu(util=95.0), fakes.mig_gpu(1)))
    c = Collector(
        fakes.FakeBackend(snap),
        hostname="node-a",
        settings=CollectorSettings(interval=1.0),
        process_owners=fake_host(tmp_path).owners,
    )
    try:
        assert c.collect_once()
        text = c.page.body(openmetrics=False, gzip=False, now=time.monotonic()).decode()
    finally:
        c.stop()
    uuid = snap.gpus[0].info.uuid
    line = next(ln for ln in text.splitlines() if ln.startswith("gpupilot_pod_gpu_utilization_ratio{"))
    assert 'gpu="0"' in line and f'UUID="{uuid}"' in line and 'pod="infer-0"' in line
    assert 'namespace="serve"' in line and 'container="server"' in line and 'Hostname="node-a"' in line
    assert line.endswith(" 0.3")
    assert text.count("gpupilot_pod_gpu_memory_used_bytes{") == 3
    assert "GPU-00000001" not in "".join(ln for ln in text.splitlines() if ln.startswith("gpupilot_pod_"))


def test_an_unreadable_proc_tree_is_counted_not_fatal():
    def broken(_pids):
        raise PermissionError("/proc: permission denied")

    snap = NodeSnapshot(taken_at=1.0, gpus=(shared_gpu(),))
    c = Collector(
        fakes.FakeBackend(snap),
        hostname="n",
        settings=CollectorSettings(interval=1.0),
        process_owners=broken,
    )
    try:
        assert c.collect_once()
        assert c.errors["processes"] == 1
        assert b"gpupilot_pod_gpu" not in c.page.body(openmetrics=False, gzip=False, now=time.monotonic())
    finally:
        c.stop()
