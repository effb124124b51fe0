"""Pod lifetimes (``start``/``end`` on a workload or a pending pod): read and checked, a device held
in turn by pods whose times do not overlap, live snapshots and the cluster endpoint showing a pod
only while it lives and a pending pod only once it has arrived, and the backfill equal to the live
values across every start and end."""

from __future__ import annotations

import io
import math

import pytest

from exporter.errors import ScenarioError
from exporter.expose.exposition import device_families
from simulator import backfill, cluster, scenario
from simulator.backend import SimBackend
from simulator.model import Scenario
from tests.simulator.test_backfill import EPOCH, _parse
from tests.support.exporter.allocations import plugin_allocations

TRACE = """
seed: 5
epoch: 2026-01-01T00:00:00Z
nodes:
  - name: n1
    gpus: [{model: H100 80GB, mig: {"3g.40gb": 1, "1g.10gb": 4}}, {model: H100 80GB}]
workloads:
  - {namespace: t, pod: early, devices: [n1/0/3g.40gb], utilization: 60, memory_mib: 9000, end: 30m}
  - {namespace: t, pod: late, devices: [n1/0/3g.40gb], utilization: 20, memory_mib: 2000, start: 40m}
  - {namespace: t, pod: whole, devices: [n1/1], utilization: {pattern: daily, base: 10, peak: 80}, start: 10m, end: 1h10m}
  - {namespace: t, pod: always, devices: [n1/0/1g.10gb], utilization: 5}
  - {namespace: t, deployment: svc, replicas: 2, devices: [n1/0/1g.10gb, n1/0/1g.10gb], utilization: 30, start: 20m, end: 50m}
pending:
  - {namespace: t, pod: late, resource: nvidia.com/mig-3g.40gb, start: 25m, end: 40m}
  - {namespace: t, pod: waits, resource: nvidia.com/gpu, count: 2, start: 50m}
"""


@pytest.fixture(scope="module")
def trace() -> Scenario:
    return scenario.loads(TRACE, name="trace.yaml")


def test_lifetimes_are_read_as_offsets_from_the_epoch(trace: Scenario) -> None:
    pods = {p.name: p for p in trace.pods}
    assert (pods["early"].start, pods["early"].end) == (-math.inf, EPOCH + 1800)
    assert (pods["late"].start, pods["late"].end) == (EPOCH + 2400, math.inf)
    assert pods["always"].lives is False and pods["whole"].lives
    # Two pods take the same 3g.40gb in turn; the deployment's replicas share its lifetime.
    assert pods["early"].devices[0].uuid == pods["late"].devices[0].uuid
    replicas = [p for p in trace.pods if p.deployment == "svc"]
    assert len(replicas) == 2 and all(p.start == EPOCH + 1200 and p.end == EPOCH + 3000 for p in replicas)
    waits = next(p for p in trace.pending if p.name == "waits")
    assert (waits.start, waits.end, waits.count) == (EPOCH + 3000, math.inf, 2)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            ("end: 30m}", "end: 30m, start: 30m}"),
            "trace.yaml:8: workloads[0].end: must be after start (30m), got 30m",
        ),
        (
            ("start: 40m}", "start: 20m}"),
            "workloads[1].devices[0]: every 3g.40gb instance of n1 GPU 0 is already held",
        ),
        (
            (
                "n1/0/3g.40gb], utilization: 20",
                "{node: n1, gpu: 0, profile: 3g.40gb, slot: 0}], utilization: 20",
            ),
            "",
        ),
        (
            ("end: 30m}", "end: 40m}"),
            "",
        ),
        (
            ("start: 25m, end: 40m}", "start: 25m, end: 41m}"),
            "pending[0].pod: pod t/late is defined twice (at overlapping times)",
        ),
        (("end: 30m}", "end: 30m, stop: 1h}"), "workloads[0].stop: unknown field (known: namespace,"),
    ],
)
def test_lifetime_problems_are_one_line(change: tuple[str, str], message: str) -> None:
    text = TRACE.replace(*change, 1)
    if not message:  # the slot named outright, or times that only touch: still held in turn
        assert len(scenario.loads(text, name="trace.yaml").pods) == 6
        return
    with pytest.raises(ScenarioError) as err:
        scenario.loads(text, name="trace.yaml")
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_named_slot_held_at_overlapping_times_says_by_whom_and_when() -> None:
    text = TRACE.replace(
        "n1/0/3g.40gb], utilization: 20", "{node: n1, gpu: 0, profile: 3g.40gb, slot: 0}], utilization: 20"
    )
    with pytest.raises(
        ScenarioError,
        match=r"workloads\[1\]\.devices\[0\]: device already held by t/early from the start to 2026-01-01T00:30:00Z",
    ):
        scenario.loads(text.replace("start: 40m}", "start: 20m}", 1), name="trace.yaml")


def _attribution(trace: Scenario, t: float) -> set[str]:
    b = SimBackend(trace, node="n1")
    return {ref.pod for refs in plugin_allocations(b, t).values() for ref in refs}


def test_live_values_show_each_pod_only_while_it_lives(trace: Scenario) -> None:
    assert _attribution(trace, EPOCH + 60) == {"early", "always"}
    assert _attribution(trace, EPOCH + 1500) >= {"early", "whole", "always"}
    assert _attribution(trace, EPOCH + 2100) == {"whole", "always"} | {
        p.name for p in trace.pods if p.deployment == "svc"
    }
    assert _attribution(trace, EPOCH + 5000) == {"late", "always"}
    b = SimBackend(trace, node="n1")
    whole_before = b.snapshot_at(EPOCH + 300).gpus[1].values["DCGM_FI_DEV_GPU_UTIL"]
    whole_during = b.snapshot_at(EPOCH + 1800).gpus[1].values["DCGM_FI_DEV_GPU_UTIL"]
    assert whole_before == 0.0 and whole_during > 0.0
    between = b.snapshot_at(EPOCH + 2100).gpus[0]  # the 3g.40gb between early and late: idle, no process
    three = next(i for i in between.instances if i.profile == "3g.40gb")
    assert three.values["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] == 0.0 and three.compute_processes == 0


def _phases(trace: Scenario, t: float) -> dict[str, str]:
    out = {}
    for fam in cluster.families(trace, t):
        if fam.name == "kube_pod_status_phase":
            for labels, v in fam.samples:
                d = dict(labels)
                if v == 1.0:
                    out[d["pod"]] = d["phase"]
    return out


def test_pending_demand_appears_when_it_arrives(trace: Scenario) -> None:
    assert "late" not in _phases(trace, EPOCH + 60) and "waits" not in _phases(trace, EPOCH + 60)
    assert _phases(trace, EPOCH + 1600)["late"] == "Pending"
    assert _phases(trace, EPOCH + 2500)["late"] == "Running"
    assert _phases(trace, EPOCH + 3100)["waits"] == "Pending"
    assert "early" not in _phases(trace, EPOCH + 1900)
    available = {
        dict(labels)["deployment"]: v
        for fam in cluster.families(trace, EPOCH + 1500)
        if fam.name == "kube_deployment_status_replicas_available"
        for labels, v in fam.samples
    }
    assert available["svc"] == 2.0
    later = cluster.families(trace, EPOCH + 3100)
    assert (
        next(v for f in later if f.name == "kube_deployment_status_replicas_available" for _l, v in f.samples)
        == 0.0
    )


def _expected(s: Scenario, t: float) -> dict[str, float]:
    """What live exporters and the cluster endpoint publish at ``t`` (pods attributed as then)."""
    fmt = backfill._Formatter()
    want: dict[str, float] = {}
    for node in s.nodes:
        b = SimBackend(s, node=node.name)
        fams = device_families(b.snapshot_at(t), hostname=node.name, allocations=plugin_allocations(b, t))
        for fam in fams:
            for labels, v in fam.samples:
                want[fmt.prefix(fam.name, labels).rstrip()] = v
    for fam in cluster.families(s, t):
        for labels, v in fam.samples:
            want[fmt.prefix(fam.name, labels).rstrip()] = v
    return want


@pytest.mark.slow
def test_backfill_equals_live_values_across_starts_and_ends(trace: Scenario) -> None:
    ts = backfill.timestamps(EPOCH, EPOCH + 7199, 60.0)
    buf = io.StringIO()
    backfill.write_window(buf, backfill.Backfiller(trace).window(ts), ts)
    got = _parse(buf.getvalue())
    for t in ts.tolist():
        assert got.get(t, {}) == _expected(trace, t), t
    assert any('pod="early"' in k for k in got[EPOCH + 1740])
    assert not any('pod="early"' in k for k in got[EPOCH + 1800])
    assert any('pod="waits"' in k for k in got[EPOCH + 3000]) and not any(
        'pod="waits"' in k for k in got[EPOCH + 2940]
    )
