"""The NVML backend against the fake NVML library: H100 MIG + GPM, A100 MIG without GPM, L4, faults."""

from __future__ import annotations

import pytest

from exporter.attribute.visibility import ProcessVisibility
from exporter.errors import BackendUnavailable
from exporter.expose.exposition import device_families
from exporter.nvml.backend import NvmlBackend
from tests.support.exporter import fake_nvml as fk

MIB = 1024 * 1024
HOST_PID = ProcessVisibility(True, "host PID namespace")


def backend_for(
    *gpus: fk.FakeGpu, visibility: ProcessVisibility = HOST_PID, **kw
) -> tuple[NvmlBackend, fk.FakeNvml]:
    lib = fk.FakeNvml(list(gpus), **kw)
    backend = NvmlBackend(
        library=lib,
        clock=lib.clock,
        wall_clock=lambda: 1.7e9,
        sleep=lib.sleep,
        visibility=lambda: visibility,
    )
    return backend, lib


@pytest.fixture
def h100():
    backend, lib = backend_for(fk.h100_mig())
    backend.open()
    yield backend, lib
    backend.close()


def test_h100_identity_instances_and_gpm_on_first_read(h100):
    backend, lib = h100
    snap = backend.read()
    assert lib.now >= 1001.0, "the first read waits until GPM samples are 1 s apart (--once)"
    (gpu,) = snap.gpus
    info = gpu.info
    assert (info.pci_device_id, info.mig_enabled, info.gpm_supported) == (0x2330, True, True)
    assert info.pci_bus_id == "00000000:18:00.0" and info.device == "nvidia0"
    assert info.driver_version == "570.124.06" and info.memory_total_mib == 81559
    layout = [(i.profile, i.placement_start, i.placement_size, i.gpu_instance_id) for i in gpu.instances]
    assert layout == [
        ("1g.10gb", 0, 1, 7),
        ("1g.10gb", 1, 1, 8),
        ("1g.10gb", 2, 1, 9),
        ("1g.10gb", 3, 1, 10),
        ("3g.40gb", 4, 4, 2),
    ]
    big = gpu.instances[-1]
    assert big.uuid == "MIG-h100-0-gi2"
    assert big.values["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] == pytest.approx(0.80)
    assert big.values["DCGM_FI_PROF_SM_ACTIVE"] == pytest.approx(0.70)
    assert big.values["DCGM_FI_PROF_SM_OCCUPANCY"] == pytest.approx(0.50)
    assert big.values["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"] == pytest.approx(0.45)
    assert big.values["DCGM_FI_PROF_DRAM_ACTIVE"] == pytest.approx(0.60)
    assert big.values["DCGM_FI_DEV_FB_USED"] == 30000 and big.values["DCGM_FI_DEV_FB_FREE"] == 40192 - 30000
    assert "DCGM_FI_PROF_PCIE_TX_BYTES" not in big.values, "PCIe is a GPU-level field"
    idle = gpu.instances[3]
    assert idle.values["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] == 0.0 and idle.compute_processes == 0
    v = gpu.values
    assert v["DCGM_FI_DEV_POWER_USAGE"] == 250.0 and v["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == 9_000_000
    assert v["DCGM_FI_DEV_GPU_TEMP"] == 40 and v["DCGM_FI_DEV_MEMORY_TEMP"] == 45
    assert v["DCGM_FI_DEV_SM_CLOCK"] == 1980 and v["DCGM_FI_DEV_MEM_CLOCK"] == 2619
    assert v["DCGM_FI_PROF_PCIE_TX_BYTES"] == 100 * MIB and v["DCGM_FI_PROF_PCIE_RX_BYTES"] == 200 * MIB
    assert "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL" not in v, "DCGM's NVLink bandwidth is a rate: two reads"
    assert v["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"] == 0
    for absent in (
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    ):
        assert absent not in v
    assert dict(snap.field_errors) == {}


def test_not_supported_is_cached_per_device(h100):
    backend, lib = h100
    for _ in range(3):
        lib.advance(10)
        snap = backend.read()
    assert "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS" not in snap.gpus[0].values
    assert lib.calls["nvmlDeviceGetRemappedRows"] == 1
    assert lib.calls["nvmlDeviceGetPowerUsage"] == 3


def test_h100_exposition_has_one_activity_series_per_instance(h100):
    backend, _ = h100
    fams = {f.name: f for f in device_families(backend.read(), hostname="node-a")}
    gr = fams["DCGM_FI_PROF_GR_ENGINE_ACTIVE"].samples
    assert len(gr) == 5
    assert {dict(labels)["GPU_I_PROFILE"] for labels, _ in gr} == {"1g.10gb", "3g.40gb"}
    assert len(fams["DCGM_FI_DEV_POWER_USAGE"].samples) == 1


def test_a100_mig_without_gpm_gives_processes_and_memory_not_activity():
    backend, lib = backend_for(fk.a100_mig())
    backend.open()
    try:
        snap = backend.read()
    finally:
        backend.close()
    (gpu,) = snap.gpus
    assert gpu.info.gpm_supported is False and gpu.info.pci_device_id == 0x20B0
    assert lib.calls["nvmlGpmSampleGet"] == 0 and lib.calls["nvmlGpmMigSampleGet"] == 0
    by_profile = {(i.profile, i.placement_start): i for i in gpu.instances}
    assert sorted(by_profile) == [("1g.5gb", 2), ("1g.5gb", 3), ("2g.10gb", 0), ("3g.20gb", 4)]
    assert [by_profile[k].compute_processes for k in sorted(by_profile)] == [0, 1, 0, 3]
    assert by_profile[("3g.20gb", 4)].values["DCGM_FI_DEV_FB_USED"] == 12000
    for inst in gpu.instances:
        assert not any(k.startswith("DCGM_FI_PROF_") for k in inst.values), "no invented activity"
    assert gpu.values["DCGM_FI_PROF_PCIE_TX_BYTES"] == 1000 * 1024, "PCIe from nvmlDeviceGetPcieThroughput"


def test_l4_whole_gpu_fields_and_absent_sensors():
    backend, _ = backend_for(fk.l4())
    backend.open()
    try:
        snap = backend.read()
    finally:
        backend.close()
    (gpu,) = snap.gpus
    v = gpu.values
    assert gpu.info.mig_enabled is False and gpu.instances == ()
    assert (v["DCGM_FI_DEV_GPU_UTIL"], v["DCGM_FI_DEV_MEM_COPY_UTIL"]) == (88, 40)
    assert (v["DCGM_FI_DEV_ENC_UTIL"], v["DCGM_FI_DEV_DEC_UTIL"]) == (5, 17)
    assert v["DCGM_FI_DEV_FB_USED"] == 6000 and v["DCGM_FI_DEV_FB_RESERVED"] == 512
    assert v["DCGM_FI_DEV_FB_FREE"] == 23034 - 6000 - 512
    assert v["DCGM_FI_DEV_POWER_USAGE"] == 41.5
    assert gpu.compute_processes == 2
    assert "DCGM_FI_DEV_MEMORY_TEMP" not in v and "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL" not in v
    assert "DCGM_FI_PROF_GR_ENGINE_ACTIVE" not in v
    assert dict(snap.field_errors) == {}


def test_one_failing_field_is_absent_counted_and_retried():
    gpu = fk.l4()
    gpu.fail["nvmlDeviceGetPowerUsage"] = fk.NVML_ERROR_UNKNOWN
    backend, lib = backend_for(gpu)
    backend.open()
    first = backend.read()
    assert "DCGM_FI_DEV_POWER_USAGE" not in first.gpus[0].values
    assert first.gpus[0].values["DCGM_FI_DEV_GPU_TEMP"] == 40
    assert dict(first.field_errors) == {"field:DCGM_FI_DEV_POWER_USAGE": 1}
    del gpu.fail["nvmlDeviceGetPowerUsage"]
    lib.advance(10)
    second = backend.read()
    backend.close()
    assert second.gpus[0].values["DCGM_FI_DEV_POWER_USAGE"] == 41.5
    assert dict(second.field_errors) == {}, "errors are per collection"


def test_lost_gpu_leaves_the_others_flowing():
    gone, stays = fk.h100_mig(0), fk.l4(1)
    backend, lib = backend_for(gone, stays)
    backend.open()
    assert lib.live_samples == 6  # primed: one whole-GPU + five MIG samples for the H100
    gone.lost = True
    lib.advance(10)
    snap = backend.read()
    assert [g.info.uuid for g in snap.gpus] == [stays.uuid]
    (lost,) = snap.lost
    assert (lost.index, lost.uuid, lost.pci_bus_id) == (0, gone.uuid, "00000000:18:00.0")
    assert "lost" in lost.reason.lower()
    assert lib.live_samples == 0, "GPM samples of the lost GPU are freed"
    backend.close()


def test_mig_reconfigured_between_cycles_is_re_enumerated(h100):
    backend, lib = h100
    backend.read()
    gpu = lib.gpus[0]
    for mig in [m for m in gpu.migs if m.profile == "1g.10gb" and m.start in (2, 3)]:
        gpu.migs.remove(mig)
    gpu.add_mig(fk.FakeMig(3, 0, "MIG-h100-0-gi3-new", 14, "2g.20gb", 2, 2, 19968, gpm={1: 10.0}))
    lib.advance(10)
    snap = backend.read()
    layout = [(i.profile, i.placement_start, i.uuid) for i in snap.gpus[0].instances]
    assert layout == [
        ("1g.10gb", 0, "MIG-h100-0-gi7"),
        ("1g.10gb", 1, "MIG-h100-0-gi8"),
        ("2g.20gb", 2, "MIG-h100-0-gi3-new"),
        ("3g.40gb", 4, "MIG-h100-0-gi2"),
    ]
    assert "DCGM_FI_PROF_GR_ENGINE_ACTIVE" not in snap.gpus[0].instances[2].values, "new: first sample only"
    lib.advance(10)
    third = backend.read()
    assert third.gpus[0].instances[2].values["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] == pytest.approx(0.10)
    assert lib.live_samples == 5, "samples of destroyed instances are freed"


def test_instance_destroyed_mid_read_is_dropped_then_re_enumerated(h100):
    backend, lib = h100
    backend.read()
    victim = lib.gpus[0].migs[1]
    victim.vanish_on = "nvmlDeviceGetMemoryInfo"
    lib.advance(10)
    snap = backend.read()
    uuids = [i.uuid for i in snap.gpus[0].instances]
    assert victim.uuid not in uuids and len(uuids) == 4
    assert snap.field_errors["mig:reconfigured"] == 1
    lib.advance(10)
    again = backend.read()
    assert len(again.gpus[0].instances) == 4 and "mig:reconfigured" not in again.field_errors


def test_mig_disabled_under_us_switches_to_whole_gpu_fields(h100):
    backend, lib = h100
    backend.read()
    gpu = lib.gpus[0]
    gpu.mig_enabled, gpu.migs, gpu.remapped = False, [], (1, 0, 0, 0)
    lib.advance(10)
    snap = backend.read()
    g = snap.gpus[0]
    assert g.info.mig_enabled is False and g.instances == ()
    assert g.values["DCGM_FI_DEV_GPU_UTIL"] == 37 and g.values["DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"] == 1
    assert "DCGM_FI_PROF_GR_ENGINE_ACTIVE" not in g.values, "a sample across the mode change is not used"
    lib.advance(10)
    g = backend.read().gpus[0]
    assert g.values["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] == pytest.approx(0.625)


def test_xid_events_are_counted_per_code(h100):
    backend, lib = h100
    gpu = lib.gpus[0]
    for code in (79, 48, 79):
        lib.inject_xid(gpu, code)
    snap = backend.read()
    g = snap.gpus[0]
    assert dict(g.xid_counts) == {79: 2, 48: 1}
    assert g.last_xid is not None and g.last_xid.code == 79 and g.last_xid.timestamp == 1.7e9
    lib.advance(10)
    later = backend.read()
    assert dict(later.gpus[0].xid_counts) == {79: 2, 48: 1}, "counts are cumulative"


def test_init_failure_is_backend_unavailable_with_one_line():
    backend, _ = backend_for(fk.l4(), init_error=fk.NVML_ERROR_DRIVER_NOT_LOADED)
    with pytest.raises(BackendUnavailable) as err:
        backend.open()
    msg = str(err.value)
    assert "NVML init failed: Driver Not Loaded" in msg and "\n" not in msg


def test_gpm_needs_100ms_between_samples(h100):
    backend, lib = h100
    backend.read()
    quick = backend.read()  # no time passed: no value rather than a wrong one
    assert "DCGM_FI_PROF_GR_ENGINE_ACTIVE" not in quick.gpus[0].instances[-1].values
    assert lib.calls["nvmlGpmMetricsGet"] == 6
    assert "gpm" not in quick.field_errors


def test_close_releases_everything_and_reopen_works(h100):
    backend, lib = h100
    backend.read()
    backend.close()
    assert lib.live_samples == 0 and lib.event_sets == [] and lib.initialised is False
    backend.open()
    assert len(backend.read().gpus) == 1


def test_gpu_instance_without_permission_falls_back_to_the_device_name():
    gpu = fk.h100_mig()
    gpu.fail["nvmlDeviceGetGpuInstanceById"] = fk.NVML_ERROR_NO_PERMISSION
    backend, _ = backend_for(gpu)
    backend.open()
    try:
        snap = backend.read()
    finally:
        backend.close()
    profiles = sorted((i.profile, i.placement_start) for i in snap.gpus[0].instances)
    assert profiles == [("1g.10gb", -1)] * 4 + [("3g.40gb", -1)]
    assert snap.field_errors["mig:placement"] == 5


def test_gpu_lost_before_enumeration_is_reported_by_index():
    gone, stays = fk.l4(0), fk.l4(1)
    gone.lost = True
    backend, _ = backend_for(gone, stays)
    backend.open()
    try:
        snap = backend.read()
    finally:
        backend.close()
    assert [g.info.index for g in snap.gpus] == [1]
    assert snap.lost[0].index == 0 and "GPU is lost" in snap.lost[0].reason


def test_driver_gone_mid_run_fails_the_collection():
    from exporter.errors import BackendError  # noqa: PLC0415

    backend, lib = backend_for(fk.l4())
    backend.open()
    lib.gpus[0].fail["nvmlDeviceGetMigMode"] = fk.NVML_ERROR_UNINITIALIZED
    with pytest.raises(BackendError, match="NVML stopped answering: Uninitialized"):
        backend.read()
    backend.close()


def test_mig_mode_read_failing_once_keeps_the_known_mode(h100):
    backend, lib = h100
    backend.read()
    lib.gpus[0].fail["nvmlDeviceGetMigMode"] = fk.NVML_ERROR_UNKNOWN
    lib.advance(10)
    snap = backend.read()
    assert snap.gpus[0].info.mig_enabled is True and len(snap.gpus[0].instances) == 5
    assert snap.field_errors["mig:mode"] == 1


def test_gpu_without_nvlink_stops_being_asked_for_links(monkeypatch: pytest.MonkeyPatch):
    backend, lib = backend_for(fk.l4())
    requested: list[int] = []
    real = lib.nvmlDeviceGetFieldValues

    def spy(handle, fieldIds):
        requested.append(len(fieldIds))
        return real(handle, fieldIds)

    monkeypatch.setattr(lib, "nvmlDeviceGetFieldValues", spy)
    backend.open()
    for _ in range(3):
        lib.advance(10)
        snap = backend.read()
    backend.close()
    assert requested == [77, 1, 1], "temperature, 36 links × 2 and 4 error totals once, then the temperature"
    assert "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL" not in snap.gpus[0].values


def test_gpm_not_supported_on_the_mig_parent_falls_back_quietly(h100):
    backend, lib = h100
    gpu = lib.gpus[0]
    gpu.fail["nvmlGpmSampleGet"] = fk.NVML_ERROR_NOT_SUPPORTED  # some drivers: no whole-GPU GPM in MIG mode
    for _ in range(3):
        lib.advance(10)
        snap = backend.read()
    g = snap.gpus[0]
    assert g.values["DCGM_FI_PROF_PCIE_TX_BYTES"] == 1000 * 1024, "PCIe from nvmlDeviceGetPcieThroughput"
    assert g.instances[-1].values["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] == pytest.approx(0.80)
    assert "gpm" not in snap.field_errors
    assert lib.calls["nvmlGpmSampleGet"] == 2, "primed once, refused once, then not asked again"


def test_gpm_sample_failing_otherwise_is_counted():
    gpu = fk.h100_mig()
    backend, lib = backend_for(gpu)
    backend.open()
    gpu.fail["nvmlGpmMigSampleGet"] = fk.NVML_ERROR_UNKNOWN
    lib.advance(10)
    snap = backend.read()
    backend.close()
    assert snap.field_errors["gpm"] == 5
    assert all("DCGM_FI_PROF_GR_ENGINE_ACTIVE" not in i.values for i in snap.gpus[0].instances)
    assert all("DCGM_FI_DEV_FB_USED" in i.values for i in snap.gpus[0].instances)


def test_open_twice_releases_the_first_session(h100):
    backend, lib = h100
    backend.read()
    backend.open()
    assert lib.live_samples == 6 and len(lib.event_sets) == 1
    lib.advance(10)
    assert len(backend.read().gpus[0].instances) == 5


def whole_h100() -> fk.FakeGpu:
    gpu = fk.h100_mig()
    gpu.mig_enabled, gpu.migs, gpu.remapped = False, [], (0, 0, 0, 0)
    return gpu


def test_opt_in_fields_from_nvml_in_dcgm_units():
    gpu = whole_h100()
    gpu.nvlink_errors = {
        fk.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: 4,
        fk.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL: 9,
    }
    gpu.clock_event_reasons = 0x4 | 0x20  # power cap + SW thermal
    backend, lib = backend_for(gpu)
    backend.open()
    try:
        lib.advance(1)
        v = backend.read().gpus[0].values
    finally:
        backend.close()
    assert v["DCGM_FI_DEV_POWER_VIOLATION"] == 5_000  # 5 ms in NVML's ns → DCGM's us
    assert v["DCGM_FI_DEV_LOW_UTIL_VIOLATION"] == 7_000_000
    assert v["DCGM_FI_DEV_THERMAL_VIOLATION"] == 0
    assert v["DCGM_FI_DEV_ECC_SBE_AGG_TOTAL"] == 12 and v["DCGM_FI_DEV_ECC_DBE_AGG_TOTAL"] == 0
    assert v["DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"] == 4
    assert v["DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"] == 9
    assert "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL" not in v  # NVML answered NOT_SUPPORTED
    assert "DCGM_FI_DEV_NVLINK_BANDWIDTH_L0" not in v  # a rate: published from the second read on
    assert v["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"] == 0x24
    assert v["DCGM_FI_PROF_PIPE_FP64_ACTIVE"] == pytest.approx(0.02)
    assert v["DCGM_FI_PROF_PIPE_FP32_ACTIVE"] == pytest.approx(0.25)
    assert v["DCGM_FI_PROF_PIPE_FP16_ACTIVE"] == pytest.approx(0.125)
    # row-remapping GPU, bare metal: no retired pages, no vGPU licence — absent, not 0
    for absent in (
        "DCGM_FI_DEV_RETIRED_SBE",
        "DCGM_FI_DEV_RETIRED_PENDING",
        "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
    ):
        assert absent not in v


def test_retired_pages_and_vgpu_licence_where_the_gpu_has_them():
    gpu = fk.l4()
    gpu.retired_pages, gpu.retired_pending, gpu.vgpu_licensed = (3, 1), True, True
    backend, lib = backend_for(gpu)
    backend.open()
    try:
        v = backend.read().gpus[0].values
        gpu.vgpu_licensed = False
        lib.advance(10)
        later = backend.read().gpus[0].values
    finally:
        backend.close()
    assert (v["DCGM_FI_DEV_RETIRED_SBE"], v["DCGM_FI_DEV_RETIRED_DBE"], v["DCGM_FI_DEV_RETIRED_PENDING"]) == (
        3,
        1,
        1,
    )
    assert v["DCGM_FI_DEV_VGPU_LICENSE_STATUS"] == 1 and later["DCGM_FI_DEV_VGPU_LICENSE_STATUS"] == 0
    assert "DCGM_FI_DEV_NVLINK_BANDWIDTH_L0" not in v  # the L4 has no NVLink


def test_nvlink_bandwidth_is_dcgms_rate_not_nvmls_cumulative_counter():
    """DCGM turns NVML's cumulative NVLink KiB counters into (delta KiB / s) / 1000; so do we. Each
    of the H100's 18 links grows by 500 KiB/s in both directions: 18 × 2 × 500 / 1000 = 18."""
    backend, lib = backend_for(fk.h100_mig())
    backend.open()
    try:
        first = backend.read().gpus[0].values
        lib.advance(10)
        second = backend.read().gpus[0].values
        lib.advance(5)
        third = backend.read().gpus[0].values
        lib.gpus[0].nvlink, lib.gpus[0].nvlink_kibps = [0] * 18, 0  # counters reset (driver reload)
        lib.advance(5)
        reset = backend.read().gpus[0].values
        lib.advance(5)
        after = backend.read().gpus[0].values
    finally:
        backend.close()
    assert "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL" not in first
    assert second["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"] == pytest.approx(18.0)
    assert second["DCGM_FI_DEV_NVLINK_BANDWIDTH_L0"] == pytest.approx(1.0)
    assert third["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"] == pytest.approx(18.0), "independent of the gap"
    assert "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL" not in reset, "no negative rate across a reset"
    assert after["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"] == 0.0, "idle links after the reset"
