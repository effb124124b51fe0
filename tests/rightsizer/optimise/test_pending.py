"""Pending demand: Pending pods requesting nvidia.com/gpu or nvidia.com/mig-* become demand served
with the capacity a plan frees (the simulator's kube-state-metrics stand-in → a real Prometheus →
``plan``), and the plan says which pending pods each change admits; plus the rules on hand-built
fleets (already free, new slots, freed GPUs re-partitioned, nothing fits)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from devkit.history import build_history
from devkit.prometheus import PrometheusServer
from rightsizer import cli
from rightsizer.analysis import pending
from rightsizer.analysis.types import PendingPod
from rightsizer.optimise.fleet import OptimiserSettings, optimise
from rightsizer.plan import build as planning
from rightsizer.plan.model import plan_from_dict, plan_to_dict
from tests.support.rightsizer.fleetspec import Dev, Node, build

SCENARIO = Path(__file__).resolve().parents[2] / "data" / "fleet-pending.yaml"


def waiting(name: str, profile: str, count: int = 1) -> PendingPod:
    return PendingPod(cluster="", namespace="ml", name=name, profile=profile, count=count)


def test_resource_names_as_kube_state_metrics_writes_them() -> None:
    assert pending.profile_of("nvidia_com_gpu") == ""
    assert pending.profile_of("nvidia_com_mig_1g_10gb") == "1g.10gb"
    assert pending.profile_of("nvidia_com_mig_1g_10gb_me") == "1g.10gb+me"
    assert pending.profile_of("nvidia.com/mig-3g.40gb") == "3g.40gb"
    assert pending.profile_of("cpu") is None


def test_freed_gpus_admit_pending_pods_whole_then_repartitioned() -> None:
    gpus = [[Dev("3g.40gb", f"p{i}", 0.05, 500), Dev("3g.40gb")] for i in range(3)]
    analysis = replace(
        build([Node("n", "H100 80GB", gpus)]),
        pending=(waiting("a-4g", "4g.40gb"), waiting("b-whole", ""), waiting("c-7g", "7g.80gb", 2)),
    )
    fleet = optimise(analysis, settings=OptimiserSettings())
    (p,) = fleet.nodes
    assert p.changed and p.gpus_freed == 2
    admitted = {a.pod.name: a.gpus for a in p.admits}
    # The whole-GPU pod takes a freed GPU as it is; the 4g pod gets the other, re-partitioned.
    assert set(admitted) == {"a-4g", "b-whole"}
    four = next(g for g in p.proposed if g.index == admitted["a-4g"][0])
    assert four.mig_enabled and four.counts.get("4g.40gb") == 1
    whole = next(g for g in p.proposed if g.index == admitted["b-whole"][0])
    assert not whole.mig_enabled
    assert any("ml/c-7g" in n and "no capacity" in n for n in fleet.notes)
    plan = planning.build_plan(analysis, fleet, context=planning.PlanContext(window="7d", settings={}))
    assert plan.totals.pods_admitted == 2
    again = plan_from_dict(plan_to_dict(plan))
    assert {a.name for a in again.nodes[0].pods_admitted} == {"a-4g", "b-whole"}
    assert any("admits pending pod ml/a-4g (1× nvidia.com/mig-4g.40gb)" in n for n in plan.notes)


def test_a_slot_free_already_is_not_credited_to_the_plan() -> None:
    gpus = [[Dev("3g.40gb", "p", 0.05, 500), Dev("2g.20gb"), Dev("1g.10gb"), Dev("1g.10gb")]]
    analysis = replace(build([Node("n", "H100 80GB", gpus)]), pending=(waiting("w", "2g.20gb"),))
    fleet = optimise(analysis, settings=OptimiserSettings())
    assert not any(p.admits for p in fleet.nodes)
    assert any("ml/w" in n and "free already" in n for n in fleet.notes)


def test_new_slots_of_a_changing_node_admit_a_pending_pod() -> None:
    # The 3g pod shrinks to 1g: the GPU's new layout has 1g slots it did not have free before.
    gpus = [[Dev("3g.40gb", "p", 0.05, 500), Dev("3g.40gb", "q", 0.05, 500)]]
    analysis = replace(build([Node("n", "H100 80GB", gpus)]), pending=(waiting("w", "1g.10gb", 2),))
    fleet = optimise(analysis, settings=OptimiserSettings())
    (p,) = fleet.nodes
    assert p.changed and [a.pod.name for a in p.admits] == ["w"]
    (gpu,) = p.admits[0].gpus
    assert next(g for g in p.proposed if g.index == gpu).counts["1g.10gb"] >= 4


@pytest.fixture(scope="module")
def pending_history(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, float]]:
    base = tmp_path_factory.mktemp("pending")
    now = time.time()
    end = now - now % 60
    build_history(
        SCENARIO, start=end - 3 * 3600, end=end, step=60.0, out_dir=base / "data", progress=None, jobs=1
    )
    with PrometheusServer(base / "data", log_file=base / "prometheus.log") as server:
        yield server.url, end


@pytest.mark.prometheus
def test_plan_serves_pending_pods_published_by_the_simulator(
    pending_history: tuple[str, float], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, end = pending_history
    out = tmp_path / "plan.json"
    code = cli.main(
        ["plan", "--prometheus-url", url, "--at", str(end), "--window", "2h", "--out", str(out), "--quiet"]
    )
    text = capsys.readouterr().out
    assert code == 0, text
    plan = json.loads(out.read_text())
    (node,) = plan["nodes"]
    assert node["changed"] and node["gpus_freed"] == 2
    admitted = {a["name"]: a for a in node["pods_admitted"]}
    assert set(admitted) == {"wants-gpu", "wants-4g"}
    assert admitted["wants-4g"]["resource"] == "nvidia.com/mig-4g.40gb"
    gpu = admitted["wants-4g"]["gpus"][0]
    assert next(g for g in node["proposed"] if g["index"] == gpu)["mig_devices"].get("4g.40gb") == 1
    assert plan["totals"]["pods_admitted"] == 2
    assert "admits ml/wants-4g" in text and "2 pending pod(s) admitted" in text
    assert any("ml/wants-4g-too" in n and "no capacity" in n for n in plan["notes"])
