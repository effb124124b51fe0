"""What a real GPU cluster does to the NVML backend: missing privileges, PID namespaces, driver and
nvidia-ml-py mismatches, GPM edge cases. Each case is a switch of the fake NVML (fake_nvml.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from exporter.attribute.visibility import ProcessVisibility, process_visibility
from exporter.expose.exposition import device_families
from tests.exporter.nvml.test_nvml import backend_for
from tests.support.exporter import fake_nvml as fk

OWN_PID_NS = ProcessVisibility(
    False, "own PID namespace (no hostPID): NVML hides other containers' processes"
)


def read_once(*gpus, **kw):
    backend, lib = backend_for(*gpus, **kw)
    backend.open()
    try:
        return backend.read(), backend, lib
    finally:
        backend.close()


# -- point 1: privileges -------------------------------------------------------------------------


def test_mig_gpu_without_cap_sys_admin_is_read_not_lost():
    snap, _, _ = read_once(fk.h100_mig(), admin=False)
    assert snap.lost == (), "NO_PERMISSION on the parent's memory info must not lose the GPU"
    (gpu,) = snap.gpus
    assert gpu.info.memory_total_mib == 0, "unknown, not a guess"
    assert len(gpu.instances) == 5
    assert all(i.placement_start == -1 for i in gpu.instances), "placement needs the GPU instance"
    assert sorted(i.profile for i in gpu.instances) == ["1g.10gb"] * 4 + ["3g.40gb"]
    assert all(i.values["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] >= 0 for i in gpu.instances)
    assert snap.field_errors["no_permission:memory_total"] == 1
    assert snap.field_errors["mig:placement"] == 5


def test_gpm_refused_without_cap_sys_admin_is_counted_once_and_not_retried():
    backend, lib = backend_for(fk.h100_mig(), admin=False, gpm_admin_only=True)
    backend.open()
    try:
        first = backend.read()
        lib.advance(10)
        second = backend.read()
    finally:
        backend.close()
    assert len(first.gpus[0].instances) == 5 and first.lost == ()
    assert all("DCGM_FI_PROF_GR_ENGINE_ACTIVE" not in i.values for i in second.gpus[0].instances)
    assert all("DCGM_FI_DEV_FB_USED" in i.values for i in second.gpus[0].instances)
    assert first.field_errors["no_permission:gpm"] == 5 and "gpm" not in first.field_errors
    assert "no_permission:gpm" not in second.field_errors, "refused once: not asked again"
    assert lib.calls["nvmlGpmMigSampleGet"] == 5


def test_whole_gpu_without_cap_sys_admin_is_unaffected():
    snap, _, _ = read_once(fk.l4(), admin=False)
    assert snap.gpus[0].info.memory_total_mib == 23034 and not snap.field_errors


# -- point 2: process visibility -----------------------------------------------------------------


def test_own_pid_namespace_publishes_no_process_counts_and_says_why():
    snap, _, lib = read_once(fk.a100_mig(), fk.l4(1), host_pid=False, visibility=OWN_PID_NS)
    assert snap.processes_visible is False
    assert all(i.compute_processes is None for g in snap.gpus for i in g.instances)
    assert all(g.compute_processes is None for g in snap.gpus)
    assert lib.calls["nvmlDeviceGetComputeRunningProcesses"] == 0, "not even asked: the answer would be 0"
    fams = {f.name: f for f in device_families(snap, hostname="n1")}
    assert "gpupilot_device_compute_processes" not in fams
    ((labels, value),) = fams["gpupilot_exporter_process_visibility"].samples
    assert value == 0.0 and dict(labels)["reason"].startswith("own PID namespace")


def test_what_the_driver_hides_is_why_counts_are_withheld():
    """The fake filters by PID namespace as the driver does: a busy slice would read 0."""
    snap, _, _ = read_once(fk.a100_mig(), host_pid=False)  # the check (wrongly) says visible
    busy = next(i for i in snap.gpus[0].instances if i.gpu_instance_id == 1)
    assert busy.compute_processes == 0, "a busy 3g.20gb with 3 processes reads 0 from its own namespace"


def test_host_pid_namespace_publishes_counts():
    snap, _, _ = read_once(fk.a100_mig())
    assert snap.processes_visible is True
    counts = {i.gpu_instance_id: i.compute_processes for i in snap.gpus[0].instances}
    assert counts == {1: 3, 3: 0, 9: 0, 10: 1}
    fams = {f.name: f for f in device_families(snap, hostname="n1")}
    assert [v for _, v in fams["gpupilot_exporter_process_visibility"].samples] == [1.0]


@pytest.mark.parametrize(
    ("status", "visible", "reason"),
    [
        ("Name:\tx\nNSpid:\t4242\n", True, "host PID namespace"),
        ("Name:\tx\nNSpid:\t4242\t7\n", False, "own PID namespace"),
        ("Name:\tx\n", False, "kernel without NSpid"),
    ],
)
def test_pid_namespace_check_reads_nspid(tmp_path: Path, status, visible, reason):
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "status").write_text(status)
    got = process_visibility(tmp_path)
    assert got.visible is visible and got.reason.startswith(reason)


def test_pid_namespace_check_without_proc(tmp_path: Path):
    got = process_visibility(tmp_path / "missing")
    assert got.visible is False and "cannot read" in got.reason


# -- point 3: driver and GPM edge cases ----------------------------------------------------------


def test_library_mismatch_on_process_list_falls_back_to_v2_and_keeps_collecting():
    backend, lib = backend_for(fk.a100_mig(), fk.l4(1), process_api=2)
    backend.open()
    try:
        snap = backend.read()
        lib.advance(10)
        again = backend.read()
    finally:
        backend.close()
    assert len(snap.gpus) == 2 and snap.lost == ()
    counts = {i.gpu_instance_id: i.compute_processes for i in snap.gpus[0].instances}
    assert counts == {1: 3, 3: 0, 9: 0, 10: 1} and snap.gpus[1].compute_processes == 2
    assert snap.field_errors["library_mismatch:compute_processes"] == 5
    assert again.gpus[1].compute_processes == 2
    assert "library_mismatch:compute_processes" not in again.field_errors, "asked once per device"
    assert lib.calls["nvmlDeviceGetComputeRunningProcesses"] == 5


def test_library_mismatch_outside_the_field_calls_drops_only_that_gpu(monkeypatch: pytest.MonkeyPatch):
    backend, lib = backend_for(fk.l4(0), fk.l4(1))
    backend.open()

    def mismatched(device):
        if device is lib.gpus[0]:
            raise fk.NVMLLibraryMismatchError("versioned symbol missing")
        return fk.FakeNvml.nvmlDeviceGetMigMode(lib, device)

    monkeypatch.setattr(lib, "nvmlDeviceGetMigMode", mismatched)
    try:
        snap = backend.read()
    finally:
        backend.close()
    assert [g.info.index for g in snap.gpus] == [1]
    assert snap.field_errors["library_mismatch:gpu:0"] == 1


def test_gpm_nan_is_left_out_not_published():
    gpu = fk.h100_mig()
    gpu.migs[0].gpm = {1: math.nan, 2: 70.0, 3: math.inf, 5: 45.0, 10: 60.0}
    snap, _, _ = read_once(gpu)
    big = next(i for i in snap.gpus[0].instances if i.gpu_instance_id == 2)
    assert "DCGM_FI_PROF_GR_ENGINE_ACTIVE" not in big.values
    assert "DCGM_FI_PROF_SM_OCCUPANCY" not in big.values
    assert big.values["DCGM_FI_PROF_SM_ACTIVE"] == pytest.approx(0.70)
    assert snap.field_errors["gpm:not_finite"] == 2
    values = [v for f in device_families(snap, hostname="n") for _, v in f.samples]
    assert values and all(math.isfinite(v) for v in values)


def test_gpm_out_of_range_is_dropped_and_rounding_clamped():
    gpu = fk.h100_mig()
    gpu.migs[0].gpm = {1: 100.4, 2: 250.0, 3: -0.2, 5: 45.0, 10: 60.0}
    snap, _, _ = read_once(gpu)
    big = next(i for i in snap.gpus[0].instances if i.gpu_instance_id == 2)
    assert big.values["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] == 1.0
    assert big.values["DCGM_FI_PROF_SM_OCCUPANCY"] == 0.0
    assert "DCGM_FI_PROF_SM_ACTIVE" not in big.values
    assert snap.field_errors["gpm:out_of_range"] == 1


def test_once_waits_a_full_second_between_gpm_samples():
    snap, _, lib = read_once(fk.h100_mig())
    assert lib.now == pytest.approx(1001.0)
    assert snap.gpus[0].instances[-1].values["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] == pytest.approx(0.80)


def test_several_compute_instances_count_memory_and_gpm_once():
    gpu = fk.h100_mig()
    fk.add_compute_instance(gpu, 2, 1, processes=1)
    fk.add_compute_instance(gpu, 2, 2)
    snap, _, _ = read_once(gpu)
    gi2 = [i for i in snap.gpus[0].instances if i.gpu_instance_id == 2]
    assert sorted(i.compute_instance_id for i in gi2) == [0, 1, 2]
    owner = next(i for i in gi2 if i.compute_instance_id == 0)
    assert owner.values["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] == pytest.approx(0.80)
    assert owner.values["DCGM_FI_DEV_FB_USED"] == 30000
    for other in (i for i in gi2 if i.compute_instance_id != 0):
        assert "DCGM_FI_PROF_GR_ENGINE_ACTIVE" not in other.values
        assert "DCGM_FI_DEV_FB_USED" not in other.values
    assert [i.compute_processes for i in sorted(gi2, key=lambda i: i.compute_instance_id)] == [2, 1, 0]
    fams = {f.name: f for f in device_families(snap, hostname="n")}
    used = sum(v for _, v in fams["DCGM_FI_DEV_FB_USED"].samples)
    assert used == 30000 + 5000 + 3 * 13, "the GPU instance's memory once, not three times"


def test_whole_gpu_gpm_returns_after_mig_is_disabled():
    gpu = fk.h100_mig()
    gpu.gpm_whole_in_mig = False
    backend, lib = backend_for(gpu)
    backend.open()
    try:
        first = backend.read()
        assert "DCGM_FI_PROF_PCIE_TX_BYTES" in first.gpus[0].values, "nvmlDeviceGetPcieThroughput fallback"
        gpu.mig_enabled, gpu.migs = False, []
        for _ in range(2):
            lib.advance(10)
            snap = backend.read()
    finally:
        backend.close()
    assert snap.gpus[0].values["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] == pytest.approx(0.625)
    assert snap.gpus[0].values["DCGM_FI_PROF_PCIE_TX_BYTES"] == 100 * 1024 * 1024
