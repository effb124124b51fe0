"""Shared GPUs as dcgm-exporter 4.5.3 labels them with ``KUBERNETES_VIRTUAL_GPUS=true``: over the real
gRPC kubelet double answering with time-slicing replica ids (``GPU-…::N``, as NVIDIA's device plugin
hands them out) and PIDs owned through a fake /proc and /var/log/containers tree. The device series
stay without pod labels; each pod holding a replica gets its own DCGM_FI_DEV_GPU_UTIL/FB_USED with
pod, namespace, container, pod_uid and vgpu (0 when idle); other fields carry the device's value.
Without the variable, one series per device (the last holder), never the device's value on every pod."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from exporter.attribute import procs
from exporter.attribute.podresources.client import PodResourcesClient
from exporter.collect.collector import Collector
from exporter.contract.layout import SeriesLayout
from exporter.settings import CollectorSettings
from exporter.snapshot import NodeSnapshot, ProcessUsage
from tests.support.exporter import fakes
from tests.support.exporter.kubelet_double import container, pod

MIB = 1024 * 1024
UID_A, UID_B = "0d3c5e7a-1b2c-4d5e-8f90-123456789abc", "9a8b7c6d-5e4f-4a3b-9c2d-1e0f9a8b7c6d"
CID = {"a": "a" * 64, "b": "b" * 64}


def fake_host(tmp_path: Path) -> procs.ContainerIndex:
    proc, logs = tmp_path / "proc", tmp_path / "containers"
    logs.mkdir()
    for pid, uid, cid in ((201, UID_A, CID["a"]), (202, UID_B, CID["b"])):
        (proc / str(pid)).mkdir(parents=True)
        slice_ = f"kubepods-burstable-pod{uid.replace('-', '_')}.slice"
        (proc / str(pid) / "cgroup").write_text(
            f"0::/kubepods.slice/kubepods-burstable.slice/{slice_}/cri-containerd-{cid}.scope\n"
        )
    (logs / f"chat-0_chat_server-{CID['a']}.log").symlink_to("/nonexistent")
    (logs / f"chat-1_chat_server-{CID['b']}.log").symlink_to("/nonexistent")
    return procs.ContainerIndex(proc_root=proc, container_logs=logs)


def page(kubelet, tmp_path: Path, *, virtual: bool) -> tuple[str, str]:
    gpu = fakes.whole_gpu(0, values={"DCGM_FI_DEV_GPU_UTIL": 36.0, "DCGM_FI_DEV_FB_USED": 12_000.0})
    gpu = dataclasses.replace(
        gpu,
        processes=(
            ProcessUsage(201, memory_bytes=8_000 * MIB, sm_util=20.0),
            ProcessUsage(202, memory_bytes=4_000 * MIB, sm_util=10.0),
        ),
    )
    uuid = gpu.info.uuid
    kubelet.set_pods(
        [
            pod("chat", "chat-0", [container("server", gpu=[f"{uuid}::0"])]),
            pod("chat", "chat-1", [container("server", gpu=[f"{uuid}::1"])]),
            pod("chat", "chat-2", [container("server", gpu=[f"{uuid}::2"])]),  # idle: no process
        ]
    )
    client = PodResourcesClient(kubelet.socket_path, timeout=2.0)
    c = Collector(
        fakes.FakeBackend(NodeSnapshot(taken_at=1.0, gpus=(gpu,))),
        hostname="node-a",
        settings=CollectorSettings(interval=1.0),
        layout=SeriesLayout(virtual_gpus=virtual),
        allocations=client.allocations,
        process_owners=fake_host(tmp_path).owners,
    )
    try:
        assert c.collect_once()
        return c.page.body(openmetrics=False, gzip=False, now=time.monotonic()).decode(), uuid
    finally:
        c.stop()
        client.close()


def lines(text: str, name: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith(name + "{")]


def test_virtual_gpus_give_each_pod_its_own_value_beside_the_devices_series(kubelet, tmp_path):
    text, _ = page(kubelet, tmp_path, virtual=True)
    util = lines(text, "DCGM_FI_DEV_GPU_UTIL")
    device = [ln for ln in util if "pod=" not in ln]
    assert len(device) == 1 and device[0].endswith(" 36")
    per_pod = {ln.split('pod="')[1].split('"')[0]: ln for ln in util if "pod=" in ln}
    assert set(per_pod) == {"chat-0", "chat-1", "chat-2"}
    assert per_pod["chat-0"].endswith(" 20") and per_pod["chat-1"].endswith(" 10")
    assert per_pod["chat-2"].endswith(" 0")  # idle pods get 0
    for name, uid, vgpu in (("chat-0", UID_A, "0"), ("chat-1", UID_B, "1"), ("chat-2", "", "2")):
        ln = per_pod[name]
        assert 'namespace="chat"' in ln and 'container="server"' in ln
        assert f'pod_uid="{uid}"' in ln and f'vgpu="{vgpu}"' in ln
    fb = {ln.split('pod="')[1].split('"')[0]: ln for ln in lines(text, "DCGM_FI_DEV_FB_USED") if "pod=" in ln}
    assert fb["chat-0"].endswith(" 8000") and fb["chat-1"].endswith(" 4000") and fb["chat-2"].endswith(" 0")
    power = lines(text, "DCGM_FI_DEV_POWER_USAGE")
    assert len(power) == 4 and all(ln.endswith(" 312.5") for ln in power)  # copied per pod, device value


def test_without_virtual_gpus_one_series_per_device_labelled_with_the_last_holder(kubelet, tmp_path):
    text, _ = page(kubelet, tmp_path, virtual=False)
    util = lines(text, "DCGM_FI_DEV_GPU_UTIL")
    assert len(util) == 1 and 'pod="chat-2"' in util[0] and util[0].endswith(" 36")
    assert "vgpu=" not in text and "pod_uid=" not in text
    # the pods' own shares stay in gpupilot's series (0.2 and 0.1 of the device)
    shares = sorted(float(ln.rsplit(" ", 1)[1]) for ln in lines(text, "gpupilot_pod_gpu_utilization_ratio"))
    assert shares == [0.1, 0.2]
    assert len(lines(text, "gpupilot_device_pod_info")) == 3  # every holder still named


def test_pod_uids_are_read_from_cgroup_paths():
    systemd = (
        f"0::/kubepods.slice/kubepods-besteffort-pod{UID_A.replace('-', '_')}.slice/crio-{'c' * 64}.scope\n"
    )
    assert procs.pod_uid_from_cgroup(systemd) == UID_A
    assert procs.pod_uid_from_cgroup(f"12:memory:/kubepods/burstable/pod{UID_B}/{'d' * 64}\n") == UID_B
    assert procs.pod_uid_from_cgroup("0::/system.slice/nvidia-mps.service\n") == ""


def test_a_pod_holding_two_replicas_of_a_gpu_counts_its_figure_once(kubelet, tmp_path):
    """A container given two replicas of one GPU: its 40,000 MiB and 30 % split over its two replica
    series, so the GPU's per-pod series add up to the device's own figures (they summed to 84,000 MiB
    against 44,000)."""
    gpu = fakes.whole_gpu(0, values={"DCGM_FI_DEV_GPU_UTIL": 40.0, "DCGM_FI_DEV_FB_USED": 44_000.0})
    gpu = dataclasses.replace(
        gpu,
        processes=(
            ProcessUsage(201, memory_bytes=40_000 * MIB, sm_util=30.0),
            ProcessUsage(202, memory_bytes=4_000 * MIB, sm_util=10.0),
        ),
    )
    uuid = gpu.info.uuid
    kubelet.set_pods(
        [
            pod("chat", "chat-0", [container("server", gpu=[f"{uuid}::0", f"{uuid}::3"])]),
            pod("chat", "chat-1", [container("server", gpu=[f"{uuid}::1"])]),
        ]
    )
    client = PodResourcesClient(kubelet.socket_path, timeout=2.0)
    c = Collector(
        fakes.FakeBackend(NodeSnapshot(taken_at=1.0, gpus=(gpu,))),
        hostname="node-a",
        settings=CollectorSettings(interval=1.0),
        layout=SeriesLayout(virtual_gpus=True),
        allocations=client.allocations,
        process_owners=fake_host(tmp_path).owners,
    )
    try:
        assert c.collect_once()
        text = c.page.body(openmetrics=False, gzip=False, now=time.monotonic()).decode()
    finally:
        c.stop()
        client.close()

    def per_pod(name: str) -> dict[tuple[str, str], float]:
        out = {}
        for ln in lines(text, name):
            if "pod=" in ln:
                key = (ln.split('pod="')[1].split('"')[0], ln.split('vgpu="')[1].split('"')[0])
                out[key] = float(ln.rsplit(" ", 1)[1])
        return out

    fb = per_pod("DCGM_FI_DEV_FB_USED")
    assert fb == {("chat-0", "0"): 20_000.0, ("chat-0", "3"): 20_000.0, ("chat-1", "1"): 4_000.0}
    assert sum(fb.values()) == 44_000.0  # the device's own figure
    util = per_pod("DCGM_FI_DEV_GPU_UTIL")
    assert util[("chat-0", "0")] == util[("chat-0", "3")] == 15.0 and sum(util.values()) <= 40.0
