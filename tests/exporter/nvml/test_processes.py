"""Per-process accounting through the NVML backend, against the fake NVML library: samples averaged
per PID and read once per interval, idle intervals, NOT_SUPPORTED (MPS) marked, no host PID view."""

from __future__ import annotations

from exporter.attribute.visibility import ProcessVisibility
from tests.exporter.nvml.test_nvml import backend_for
from tests.support.exporter import fake_nvml as fk

MIB = 1024 * 1024


def shared_l4() -> fk.FakeGpu:
    gpu = fk.l4()
    gpu.process_list = [
        (4242, 3000, [(1_000, 20), (2_000, 40)]),  # mean 30 %
        (4343, 1000, [(1_500, 10)]),
    ]
    return gpu


def test_processes_carry_memory_and_mean_sm_utilisation():
    backend, _lib = backend_for(shared_l4())
    backend.open()
    try:
        (gpu,) = backend.read().gpus
    finally:
        backend.close()
    assert gpu.process_util_visible is True and gpu.compute_processes == 2
    got = {p.pid: (p.memory_bytes, p.sm_util) for p in gpu.processes or ()}
    assert got == {4242: (3000 * MIB, 30.0), 4343: (1000 * MIB, 10.0)}


def test_each_sample_is_read_once_and_an_idle_interval_reads_zero():
    gpu = shared_l4()
    backend, _lib = backend_for(gpu)
    backend.open()
    try:
        backend.read()
        (second,) = backend.read().gpus  # no new sample: NOT_FOUND from NVML, every process idle
        assert {p.pid: p.sm_util for p in second.processes or ()} == {4242: 0.0, 4343: 0.0}
        gpu.process_list = [(4242, 3000, [(1_000, 20), (2_000, 40), (3_000, 90)]), (4343, 1000, [])]
        (third,) = backend.read().gpus
        assert {p.pid: p.sm_util for p in third.processes or ()} == {4242: 90.0, 4343: 0.0}
    finally:
        backend.close()


def test_nvidia_ml_py_raising_success_for_no_samples_reads_as_idle():
    gpu = shared_l4()
    gpu.fail["nvmlDeviceGetProcessUtilization"] = fk.NVML_SUCCESS
    backend, _lib = backend_for(gpu)
    backend.open()
    try:
        (snap_gpu,) = backend.read().gpus
    finally:
        backend.close()
    assert snap_gpu.process_util_visible is True
    assert {p.pid: p.sm_util for p in snap_gpu.processes or ()} == {4242: 0.0, 4343: 0.0}


def test_not_supported_marks_the_gpu_and_leaves_utilisation_unknown():
    gpu = shared_l4()
    gpu.fail["nvmlDeviceGetProcessUtilization"] = fk.NVML_ERROR_NOT_SUPPORTED
    backend, lib = backend_for(gpu)
    backend.open()
    try:
        (snap_gpu,) = backend.read().gpus
        backend.read()
    finally:
        backend.close()
    assert snap_gpu.process_util_visible is False
    assert {p.pid: p.sm_util for p in snap_gpu.processes or ()} == {4242: None, 4343: None}
    assert {p.pid: p.memory_bytes for p in snap_gpu.processes or ()} == {4242: 3000 * MIB, 4343: 1000 * MIB}
    assert lib.calls["nvmlDeviceGetProcessUtilization"] == 1  # not asked again


def test_without_the_host_pid_namespace_there_is_no_process_accounting():
    backend, _lib = backend_for(shared_l4(), visibility=ProcessVisibility(False, "container PID namespace"))
    backend.open()
    try:
        (gpu,) = backend.read().gpus
    finally:
        backend.close()
    assert gpu.processes is None and gpu.compute_processes is None
