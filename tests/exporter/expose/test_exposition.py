"""The pure snapshot → families function: placement of fields on whole GPUs and MIG instances, pod labels."""

from __future__ import annotations

from types import MappingProxyType

from exporter.expose.exposition import Family, device_families
from exporter.snapshot import GpuSnapshot, PodRef
from tests.support.exporter import fakes

HOST = "node-a"


def fam(fams: list[Family], name: str) -> Family:
    found = [f for f in fams if f.name == name]
    assert len(found) == 1, f"{name} appears {len(found)} times"
    return found[0]


def names(fams: list[Family]) -> set[str]:
    return {f.name for f in fams}


def labels_of(sample: tuple[tuple[tuple[str, str], ...], float]) -> dict[str, str]:
    return dict(sample[0])


def test_whole_gpu_carries_device_and_gpu_fields_with_dcgm_labels() -> None:
    fams = device_families(fakes.node(fakes.whole_gpu(0)), hostname=HOST)
    util = fam(fams, "DCGM_FI_DEV_GPU_UTIL")
    assert len(util.samples) == 1
    labels = labels_of(util.samples[0])
    assert labels == {
        "gpu": "0",
        "UUID": fakes.gpu_info(0).uuid,
        "pci_bus_id": "00000000:18:00.0",
        "device": "nvidia0",
        "modelName": "NVIDIA H100 80GB HBM3",
        "Hostname": HOST,
        "DCGM_FI_DRIVER_VERSION": fakes.DRIVER,
    }
    assert util.samples[0][1] == 87.0
    assert fam(fams, "DCGM_FI_DEV_POWER_USAGE").samples[0][1] == 312.5
    assert fam(fams, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION").kind == "counter"
    assert "GPU_I_PROFILE" not in labels


def test_mig_gpu_level_fields_once_per_physical_gpu_device_fields_per_instance() -> None:
    fams = device_families(fakes.node(fakes.mig_gpu(0, 7), fakes.mig_gpu(1, 3)), hostname=HOST)
    power = fam(fams, "DCGM_FI_DEV_POWER_USAGE")
    assert len(power.samples) == 2  # once per physical GPU, not once per instance
    assert all("GPU_I_ID" not in labels_of(s) for s in power.samples)
    active = fam(fams, "DCGM_FI_PROF_GR_ENGINE_ACTIVE")
    assert len(active.samples) == 10
    first = labels_of(active.samples[0])
    assert first["GPU_I_PROFILE"] == "1g.10gb"
    assert first["GPU_I_ID"] == "9"
    assert first["UUID"] == fakes.gpu_info(0).uuid  # the physical GPU's UUID, as dcgm-exporter
    assert len(fam(fams, "DCGM_FI_DEV_FB_USED").samples) == 10


def test_whole_gpu_only_fields_do_not_appear_on_mig_gpus() -> None:
    gpu = fakes.mig_gpu(0, 2)
    # even if a backend wrongly reports GPU_UTIL on a MIG GPU, it is not published there
    bad = GpuSnapshot(
        info=gpu.info,
        values=MappingProxyType({**gpu.values, "DCGM_FI_DEV_GPU_UTIL": 5.0}),
        instances=gpu.instances,
    )
    fams = device_families(fakes.node(bad), hostname=HOST)
    assert "DCGM_FI_DEV_GPU_UTIL" not in names(fams)


def test_absent_fields_stay_absent_never_zero() -> None:
    gpu = fakes.whole_gpu(0)
    values = {k: v for k, v in gpu.values.items() if k != "DCGM_FI_DEV_POWER_USAGE"}
    fams = device_families(
        fakes.node(GpuSnapshot(info=gpu.info, values=MappingProxyType(values))), hostname=HOST
    )
    assert "DCGM_FI_DEV_POWER_USAGE" not in names(fams)
    assert "DCGM_FI_DEV_MEMORY_TEMP" not in names(fams)  # never reported by the fake
    assert "DCGM_FI_DEV_GPU_TEMP" in names(fams)


def test_pod_labels_on_whole_gpu_and_instances_and_pod_info() -> None:
    snap = fakes.node(fakes.whole_gpu(0), fakes.mig_gpu(1, 2))
    whole_pod = PodRef("ai-serving", "llm-inference-0", "server")
    slice_pod = PodRef("batch", "etl-1", "worker", "nvidia.com/mig-1g.10gb")
    allocations = {fakes.gpu_info(0).uuid: (whole_pod,), snap.gpus[1].instances[1].uuid: (slice_pod,)}
    fams = device_families(snap, hostname=HOST, allocations=allocations)
    util = labels_of(fam(fams, "DCGM_FI_DEV_GPU_UTIL").samples[0])
    assert (util["pod"], util["namespace"], util["container"]) == ("llm-inference-0", "ai-serving", "server")
    active = [labels_of(s) for s in fam(fams, "DCGM_FI_PROF_GR_ENGINE_ACTIVE").samples]
    on_mig = [a for a in active if a.get("GPU_I_ID")]
    assert [a.get("pod") for a in on_mig] == [None, "etl-1"]
    # GPU-level fields of the MIG GPU belong to no single pod
    power = [labels_of(s) for s in fam(fams, "DCGM_FI_DEV_POWER_USAGE").samples]
    assert power[1].get("pod") is None
    assert power[0]["pod"] == "llm-inference-0"
    pod_info = [labels_of(s) for s in fam(fams, "gpupilot_device_pod_info").samples]
    assert {p["pod"] for p in pod_info} == {"llm-inference-0", "etl-1"}


def test_a_shared_device_is_labelled_with_its_last_holder_as_dcgm_exporter_does() -> None:
    """dcgm-exporter keeps one pod per device id (the last container of the List answer): one series
    with the device's value, never the whole device's value repeated on every pod."""
    snap = fakes.node(fakes.whole_gpu(0))
    holders = (PodRef("a", "p1", "c", replica="0"), PodRef("b", "p2", "c", replica="1"))
    fams = device_families(snap, hostname=HOST, allocations={fakes.gpu_info(0).uuid: holders})
    util = fam(fams, "DCGM_FI_DEV_GPU_UTIL").samples
    assert [(labels_of(s)["pod"], s[1]) for s in util] == [("p2", 87.0)]
    # gpupilot's own pod-info series still names every holder
    assert sorted(labels_of(s)["pod"] for s in fam(fams, "gpupilot_device_pod_info").samples) == ["p1", "p2"]


def test_unallocated_device_has_no_pod_labels_and_no_pod_info() -> None:
    fams = device_families(fakes.node(fakes.whole_gpu(0)), hostname=HOST, allocations={})
    assert "gpupilot_device_pod_info" not in names(fams)
    assert "pod" not in labels_of(fam(fams, "DCGM_FI_DEV_GPU_UTIL").samples[0])


def test_info_families_describe_gpu_and_instances() -> None:
    fams = device_families(fakes.node(fakes.mig_gpu(0, 2)), hostname=HOST)
    info = labels_of(fam(fams, "gpupilot_gpu_info").samples[0])
    assert info["pci_device_id"] == "0x2330"
    assert info["mig_mode"] == "enabled"
    mig = [labels_of(s) for s in fam(fams, "gpupilot_mig_instance_info").samples]
    assert [(m["GPU_I_ID"], m["placement_start"], m["placement_size"]) for m in mig] == [
        ("9", "0", "1"),
        ("10", "1", "1"),
    ]
    assert mig[0]["mig_uuid"].startswith("MIG-")
    procs = fam(fams, "gpupilot_device_compute_processes").samples
    assert len(procs) == 2 and all(v == 1.0 for _, v in procs)


def test_xid_last_value_and_counter_per_code() -> None:
    snap = fakes.node(fakes.with_xid(fakes.whole_gpu(0), 79, count=2), fakes.whole_gpu(1))
    fams = device_families(snap, hostname=HOST)
    xid = fam(fams, "DCGM_FI_DEV_XID_ERRORS")
    assert len(xid.samples) == 2  # the GPU without an Xid publishes 0 (as dcgm-exporter)
    assert sorted(v for _, v in xid.samples) == [0.0, 79.0]
    labels, value = max(xid.samples, key=lambda s: s[1])
    assert value == 79.0
    assert dict(labels)["err_code"] == "79"
    assert dict(labels)["err_msg"] == "GPU has fallen off the bus"
    total = fam(fams, "gpupilot_xid_errors_total")
    assert total.kind == "counter"
    assert [(dict(lb)["xid"], v) for lb, v in total.samples] == [("79", 2.0)]


def test_lost_gpu_series_go_and_lost_series_says_so() -> None:
    snap = fakes.node(fakes.whole_gpu(0), lost=(fakes.lost(1),))
    fams = device_families(snap, hostname=HOST)
    assert {labels_of(s)["gpu"] for s in fam(fams, "DCGM_FI_DEV_POWER_USAGE").samples} == {"0"}
    gone = fam(fams, "gpupilot_gpu_lost").samples
    assert len(gone) == 1
    assert labels_of(gone[0])["gpu"] == "1"
    assert labels_of(gone[0])["reason"] == "gpu_is_lost"


def test_empty_node_gives_no_families() -> None:
    assert device_families(fakes.node(), hostname=HOST) == []
