"""SimBackend: pure snapshots, field consistency, allocations, and every scheduled fault."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from exporter.contract import fields
from exporter.errors import BackendUnavailable, ScenarioError
from exporter.expose.exposition import device_families
from simulator import scenario
from simulator.backend import SimBackend
from simulator.model import Scenario
from tests.support.exporter.allocations import plugin_allocations

DEMO = Path(__file__).resolve().parents[2] / "examples" / "fleet-demo.yaml"
EPOCH = 1_767_225_600.0  # 2026-01-01T00:00:00Z
T = EPOCH + 300 * 86400 + 15 * 3600  # a weekday afternoon


def test_same_time_same_snapshot_across_backends(demo: Scenario) -> None:
    a = SimBackend(demo, node="gpu-h100-a")
    b = SimBackend.from_file(DEMO, node="gpu-h100-a")
    assert a.snapshot_at(T) == a.snapshot_at(T) == b.snapshot_at(T)
    assert a.snapshot_at(T) != a.snapshot_at(T + 3600)
    assert a.allocations() == b.allocations()


def test_read_uses_the_clock_and_equals_snapshot_at(demo: Scenario) -> None:
    backend = SimBackend(demo, node="gpu-h200-a", clock=lambda: T)
    backend.open()
    assert backend.read() == backend.snapshot_at(T)
    backend.close()


def test_unknown_node_is_one_line(demo: Scenario) -> None:
    with pytest.raises(ScenarioError, match="no node 'nope' in the scenario"):
        SimBackend(demo, node="nope")


def test_whole_gpu_fields_are_consistent(demo: Scenario) -> None:
    snap = SimBackend(demo, node="gpu-h100-a").snapshot_at(T)
    gpu = snap.gpus[0]
    assert not gpu.info.mig_enabled and gpu.info.gpm_supported
    v = gpu.values
    gpu_fields = {f.name for f in fields.FIELDS} - {"DCGM_FI_DEV_VGPU_LICENSE_STATUS"}
    assert gpu_fields <= set(v)  # an H100 whole GPU has every field but vGPU's (bare metal)
    assert "DCGM_FI_DEV_VGPU_LICENSE_STATUS" not in v
    total = gpu.info.memory_total_mib
    assert v["DCGM_FI_DEV_FB_FREE"] + v["DCGM_FI_DEV_FB_USED"] + v["DCGM_FI_DEV_FB_RESERVED"] == total
    assert v["DCGM_FI_DEV_FB_USED"] == 71000  # llm-inference's memory
    assert 0 <= v["DCGM_FI_DEV_GPU_UTIL"] <= 100
    assert v["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] == pytest.approx(v["DCGM_FI_DEV_GPU_UTIL"] / 100, abs=0.006)
    assert 70 * 0.8 <= v["DCGM_FI_DEV_POWER_USAGE"] <= 700 * 1.02
    assert gpu.compute_processes == 1


def test_power_and_temperature_follow_utilisation(demo: Scenario) -> None:
    backend = SimBackend(demo, node="gpu-h100-a")
    busy = backend.snapshot_at(EPOCH + 300 * 86400 + 15 * 3600).gpus[0].values  # llm peak hour
    quiet = backend.snapshot_at(EPOCH + 300 * 86400 + 3 * 3600).gpus[0].values
    assert busy["DCGM_FI_DEV_GPU_UTIL"] > quiet["DCGM_FI_DEV_GPU_UTIL"] + 30
    assert busy["DCGM_FI_DEV_POWER_USAGE"] > quiet["DCGM_FI_DEV_POWER_USAGE"] + 150
    assert busy["DCGM_FI_DEV_GPU_TEMP"] > quiet["DCGM_FI_DEV_GPU_TEMP"]


def test_energy_counter_integrates_power(demo: Scenario) -> None:
    backend = SimBackend(demo, node="gpu-h100-a")
    samples = [backend.snapshot_at(T + i * 60.0).gpus[0].values for i in range(61)]
    energy = [s["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] for s in samples]
    assert all(b > a for a, b in itertools.pairwise(energy))
    mean_power = sum(s["DCGM_FI_DEV_POWER_USAGE"] for s in samples[:-1]) / 60
    joules = (energy[-1] - energy[0]) / 1000
    assert joules / 3600 == pytest.approx(mean_power, rel=0.03)


def test_mig_instances_have_device_fields_and_gpu_level_fields_once(demo: Scenario) -> None:
    snap = SimBackend(demo, node="gpu-h100-a").snapshot_at(T)
    gpu = snap.gpus[3]  # inference-mix
    assert gpu.info.mig_enabled
    assert [i.profile for i in gpu.instances].count("1g.10gb") == 5
    assert "DCGM_FI_DEV_GPU_UTIL" not in gpu.values and "DCGM_FI_DEV_POWER_USAGE" in gpu.values
    for inst in gpu.instances:
        v = inst.values
        assert v["DCGM_FI_DEV_FB_FREE"] + v["DCGM_FI_DEV_FB_USED"] + v["DCGM_FI_DEV_FB_RESERVED"] > 0
        assert 0 <= v["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] <= 1
        assert "DCGM_FI_DEV_POWER_USAGE" not in v
    allocs = plugin_allocations(SimBackend(demo, node="gpu-h100-a"))
    free = [i for i in gpu.instances if i.uuid not in allocs]
    assert free and all(i.values["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] == 0 for i in free)
    assert all(i.compute_processes == 0 for i in free)


def test_ampere_mig_has_no_invented_activity(demo: Scenario) -> None:
    snap = SimBackend(demo, node="gpu-a100-a").snapshot_at(T)
    for gpu in snap.gpus:
        assert not gpu.info.gpm_supported
        for inst in gpu.instances:
            assert "DCGM_FI_PROF_GR_ENGINE_ACTIVE" not in inst.values
            assert "DCGM_FI_DEV_FB_USED" in inst.values and inst.compute_processes is not None


def test_allocations_map_devices_to_pods_with_resource_names(demo: Scenario) -> None:
    backend = SimBackend(demo, node="gpu-h100-b")
    allocs = plugin_allocations(backend)
    node = demo.node("gpu-h100-b")
    whole = allocs[node.gpus[0].uuid]
    assert [(r.namespace, r.container, r.resource) for r in whole] == [
        ("ai-serving", "vllm", "nvidia.com/gpu")
    ]
    assert whole[0].pod.startswith("llm-inference-")
    mig_refs = [refs[0] for uuid, refs in allocs.items() if uuid.startswith("MIG-")]
    assert {r.resource for r in mig_refs} == {"nvidia.com/mig-1g.10gb", "nvidia.com/mig-2g.20gb"}
    single = plugin_allocations(SimBackend(demo, node="gpu-a100-a"))
    assert {refs[0].resource for refs in single.values()} == {"nvidia.com/gpu"}  # single strategy
    fams = {
        f.name: f for f in device_families(backend.snapshot_at(T), hostname="gpu-h100-b", allocations=allocs)
    }
    pods = {dict(labels)["pod"] for labels, _ in fams["gpupilot_device_pod_info"].samples}
    assert pods == {r.pod for refs in allocs.values() for r in refs}


FAULTS = """
seed: 1
epoch: 2026-01-01T00:00:00Z
nodes: [{name: n, gpus: [{model: H100 80GB, count: 2}]}]
faults:
  - {kind: gpu_lost, node: n, gpu: 1, at: 1h, duration: 10m, every: 1d}
  - {kind: xid, node: n, gpu: 0, code: 79, at: 2h, every: 6h}
  - {kind: xid, node: n, gpu: 0, code: 13, at: 3h}
  - {kind: nvml_error, node: n, gpu: 0, field: DCGM_FI_DEV_POWER_USAGE, at: 4h, duration: 5m}
  - {kind: hung, node: n, gpu: 0, at: 5h, duration: 2m, block: 30s}
  - {kind: init_error, node: n, at: 6h30m, duration: 1m}
"""


@pytest.fixture
def faulty() -> Scenario:
    return scenario.loads(FAULTS, name="faults.yaml")


def test_gpu_lost_only_during_its_window(faulty: Scenario) -> None:
    b = SimBackend(faulty, node="n")
    before, during, after = (b.snapshot_at(EPOCH + s) for s in (3599, 3600 + 300, 3600 + 600))
    assert [g.info.index for g in during.gpus] == [0]
    assert [(x.index, x.uuid) for x in during.lost] == [(1, faulty.nodes[0].gpus[1].uuid)]
    assert len(before.gpus) == len(after.gpus) == 2 and not before.lost and not after.lost
    nxt = b.snapshot_at(EPOCH + 86400 + 3600 + 1)
    assert [x.index for x in nxt.lost] == [1]  # every: 1d


def test_xid_counts_and_last_xid(faulty: Scenario) -> None:
    b = SimBackend(faulty, node="n")
    assert b.snapshot_at(EPOCH + 7000).gpus[0].last_xid is None
    s = b.snapshot_at(EPOCH + 3 * 3600 + 1)
    gpu = s.gpus[0]
    assert dict(gpu.xid_counts) == {79: 1, 13: 1}
    assert gpu.last_xid is not None and (gpu.last_xid.code, gpu.last_xid.timestamp) == (13, EPOCH + 3 * 3600)
    later = b.snapshot_at(EPOCH + 14 * 3600).gpus[0]
    assert (
        dict(later.xid_counts) == {79: 3, 13: 1} and later.last_xid is not None and later.last_xid.code == 79
    )
    fams = {f.name: f for f in device_families(s, hostname="n")}
    assert {dict(lab)["xid"]: v for lab, v in fams["gpupilot_xid_errors_total"].samples} == {
        "13": 1.0,
        "79": 1.0,
    }
    assert fams["DCGM_FI_DEV_XID_ERRORS"].samples[0][1] == 13.0


def test_nvml_error_drops_one_field_and_counts_it(faulty: Scenario) -> None:
    s = SimBackend(faulty, node="n").snapshot_at(EPOCH + 4 * 3600 + 10)
    assert "DCGM_FI_DEV_POWER_USAGE" not in s.gpus[0].values
    assert "DCGM_FI_DEV_GPU_TEMP" in s.gpus[0].values and "DCGM_FI_DEV_POWER_USAGE" in s.gpus[1].values
    assert dict(s.field_errors) == {"field:DCGM_FI_DEV_POWER_USAGE": 1}


def test_hung_read_blocks_but_snapshot_at_does_not(faulty: Scenario) -> None:
    now = [EPOCH + 5 * 3600 + 10]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    b = SimBackend(faulty, node="n", clock=lambda: now[0], sleep=sleep)
    b.open()
    snap = b.read()
    assert slept == [30.0] and snap.taken_at == EPOCH + 5 * 3600 + 40
    b.snapshot_at(EPOCH + 5 * 3600 + 20)
    assert slept == [30.0]
    now[0] = EPOCH + 5 * 3600 + 110  # 10 s left in the window: blocks for the rest only
    b.read()
    assert slept == [30.0, 10.0]


def test_init_error_fails_open_on_schedule(faulty: Scenario) -> None:
    now = [EPOCH + 6.5 * 3600 + 5]
    b = SimBackend(faulty, node="n", clock=lambda: now[0])
    with pytest.raises(BackendUnavailable, match="init"):
        b.open()
    now[0] += 60
    b.open()
    assert b.read().taken_at == now[0]
