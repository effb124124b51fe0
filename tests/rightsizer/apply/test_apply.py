"""apply end to end against the Kubernetes API double and its simulated MIG Manager: success,
rollback on failure, resume after a kill, conflicts, nodes changed since the plan, PDB timeouts."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from rightsizer.apply import configmap
from rightsizer.apply import protocol as proto
from rightsizer.apply.configmap import GPUPILOT_CONFIGMAP
from tests.support.kubedouble import KubeDouble, MigManagerSettings, default_mig_configs
from tests.support.rightsizer.apply_support import (
    FAST,
    GOOD,
    Change,
    break_node,
    make_plan,
    run_apply,
    seed_node,
)


class Crash(Exception):
    """Stands in for the apply process being killed."""


def configs_in(kube, name):
    return yaml.safe_load(kube.configmap(name)["data"]["config.yaml"])["mig-configs"]


@pytest.mark.slow
def test_plan_applies_nodes_and_keeps_every_other_config(kube):
    seed_node(kube, "gpu-a")
    seed_node(kube, "gpu-b")
    plan = make_plan([Change("gpu-a", "all-1g.10gb", GOOD), Change("gpu-b", "all-1g.10gb", GOOD)])
    target = plan.nodes[0].config_name
    report, lines = run_apply(kube, plan, dataclasses.replace(FAST, max_parallel=2))
    assert [o.result for o in report.outcomes] == ["applied", "applied"]
    for node in ("gpu-a", "gpu-b"):
        labels, ann = kube.labels(node), kube.annotations(node)
        assert labels[proto.CONFIG_LABEL] == target and labels[proto.STATE_LABEL] == "success"
        assert labels["nvidia.com/mig-3g.40gb.count"] == "8"
        assert not kube.node(node)["spec"].get("unschedulable")
        assert ann[proto.ANN_STEP] == "done" and ann[proto.ANN_PREVIOUS] == "all-1g.10gb"
        assert ann[proto.ANN_PLAN] == plan.plan_id
        assert [p["metadata"]["name"] for p in kube.pods(node=node)] == [f"{node}-cpu-job"]
    configs = configs_in(kube, GPUPILOT_CONFIGMAP)
    assert set(default_mig_configs()) <= set(configs)  # the operator's configs survive the repoint
    assert configs[target][0]["mig-devices"] == GOOD
    assert kube.cluster_policy()["spec"]["migManager"]["config"]["name"] == GPUPILOT_CONFIGMAP
    assert {e["reason"] for e in kube.events(involving="gpu-a")} == {"MigReconfigured"}
    assert ("gpu-a", "cordoned") in lines and ("gpu-a", f"{proto.STATE_LABEL}=success") in lines


@pytest.mark.slow
def test_pods_are_evicted_only_after_cordon_and_relabel_only_after_eviction(kube):
    seed_node(kube, "gpu-a")
    report, _ = run_apply(kube, make_plan([Change("gpu-a", "all-1g.10gb", GOOD)]))
    assert report.ok
    node_writes = kube.actions(resource="nodes", name="gpu-a")
    cordon = next(
        a for a in node_writes if a.verb == "patch" and a.detail["body"].get("spec", {}).get("unschedulable")
    )
    relabel = next(a for a in node_writes if a.verb == "patch" and "labels" in a.detail["body"]["metadata"])
    evictions = kube.actions(verb="evict")
    assert len(evictions) == 2
    assert all(cordon.seq < e.seq < relabel.seq for e in evictions)
    states = [a.detail["state"] for a in kube.actions(verb="mig-manager") if a.seq > relabel.seq]
    assert states == ["pending", "success"]


@pytest.mark.slow
def test_writes_into_the_custom_configmap_the_cluster_policy_already_uses(kube):
    seed = yaml.safe_dump(
        {
            "version": "v1",
            "mig-configs": {
                "all-disabled": [{"devices": "all", "mig-enabled": False}],
                "inference-mix": [
                    {"devices": [0], "mig-enabled": True, "mig-devices": {"1g.10gb": 5, "2g.20gb": 1}},
                    {"devices": [1, 2, 3], "mig-enabled": False},
                ],
                "all-1g.10gb": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}],
            },
        }
    )
    kube.add_configmap("custom-mig-config", data={"config.yaml": seed})
    kube.store.update(
        "nvidia.com/clusterpolicies",
        "",
        "cluster-policy",
        lambda cp: cp["spec"]["migManager"]["config"].update(name="custom-mig-config"),
    )
    seed_node(kube, "gpu-a")
    plan = make_plan([Change("gpu-a", "all-1g.10gb", GOOD)])
    report, _ = run_apply(kube, plan)
    assert report.ok and report.configmap == "custom-mig-config" and not report.cluster_policy_patched
    configs = configs_in(kube, "custom-mig-config")
    assert set(configs) == {"all-disabled", "inference-mix", "all-1g.10gb", plan.nodes[0].config_name}
    assert kube.configmap(GPUPILOT_CONFIGMAP) is None
    assert kube.actions(resource="clusterpolicies") == []


@pytest.mark.slow
def test_failure_rolls_back_restores_label_uncordons_records_event_and_stops(kube):
    seed_node(kube, "gpu-a")
    seed_node(kube, "gpu-b")
    break_node(kube, "gpu-a")
    plan = make_plan([Change("gpu-a", "all-1g.10gb", GOOD), Change("gpu-b", "all-1g.10gb", GOOD)])
    report, lines = run_apply(kube, plan)
    assert [(o.node, o.result) for o in report.outcomes] == [
        ("gpu-a", "rolled-back"),
        ("gpu-b", "not-started"),
    ]
    assert "failed" in report.outcomes[0].reason and "gpu-a" in report.outcomes[1].reason
    labels = kube.labels("gpu-a")
    assert labels[proto.CONFIG_LABEL] == "all-1g.10gb"
    kube.wait_for(
        lambda: kube.labels("gpu-a").get(proto.STATE_LABEL) == "success"
    )  # manager: already applied
    assert not kube.node("gpu-a")["spec"].get("unschedulable")
    assert kube.annotations("gpu-a")[proto.ANN_STEP] == "rolled-back"
    warnings = [e for e in kube.events(involving="gpu-a") if e["type"] == "Warning"]
    assert warnings and warnings[0]["reason"] == "MigReconfigureFailed"
    assert kube.actions(name="gpu-b", resource="nodes") == []  # never touched
    assert any("rolled back" in m for n, m in lines if n == "gpu-a")


@pytest.mark.slow
def test_a_node_cordoned_before_apply_stays_cordoned(kube):
    kube.add_node("gpu-a", mig_config="all-1g.10gb", unschedulable=True)
    report, _ = run_apply(kube, make_plan([Change("gpu-a", "all-1g.10gb", GOOD)]))
    assert report.ok and kube.node("gpu-a")["spec"]["unschedulable"] is True


@pytest.mark.slow
@pytest.mark.parametrize("crash_after", ["cordoned", "drained: no pod holds its GPUs", "relabelled"])
def test_killed_apply_resumes_without_repeating_steps(kube, crash_after):
    seed_node(kube, "gpu-a")
    plan = make_plan([Change("gpu-a", "all-1g.10gb", GOOD)])

    def crash(node: str, msg: str) -> None:
        if node == "gpu-a" and msg.startswith(crash_after):
            raise Crash(msg)

    with pytest.raises(Crash):
        run_apply(kube, plan, progress=crash)
    step_at_crash = kube.annotations("gpu-a")[proto.ANN_STEP]
    cordons_before = len(
        [
            a
            for a in kube.actions(verb="patch", name="gpu-a")
            if a.detail["body"].get("spec", {}).get("unschedulable")
        ]
    )
    report, lines = run_apply(kube, plan)
    assert [o.result for o in report.outcomes] == ["applied"]
    assert ("gpu-a", f"resuming after step {step_at_crash}") in lines
    assert kube.labels("gpu-a")[proto.CONFIG_LABEL] == plan.nodes[0].config_name
    assert len(kube.actions(verb="evict")) == 2  # each pod evicted once across both runs
    cordons = [
        a
        for a in kube.actions(verb="patch", name="gpu-a")
        if a.detail["body"].get("spec", {}).get("unschedulable")
    ]
    assert len(cordons) == cordons_before == 1
    again, _ = run_apply(kube, plan)
    assert again.outcomes[0].result == "already-applied"


@pytest.mark.slow
def test_restart_after_the_manager_failed_rolls_back(kube):
    seed_node(kube, "gpu-a")
    break_node(kube, "gpu-a")
    plan = make_plan([Change("gpu-a", "all-1g.10gb", GOOD)])

    def crash(node: str, msg: str) -> None:
        if msg.startswith("relabelled"):
            raise Crash(msg)

    with pytest.raises(Crash):
        run_apply(kube, plan, progress=crash)
    kube.wait_for(lambda: kube.labels("gpu-a").get(proto.STATE_LABEL) == "failed")
    report, _ = run_apply(kube, plan)
    assert report.outcomes[0].result == "rolled-back"
    assert kube.labels("gpu-a")[proto.CONFIG_LABEL] == "all-1g.10gb"
    third, _ = run_apply(kube, plan)
    assert third.outcomes[0].result == "skipped" and "rolled back earlier" in third.outcomes[0].reason


@pytest.mark.slow
def test_conflicts_are_retried(kube):
    seed_node(kube, "gpu-a", pods=0)
    kube.add_configmap(GPUPILOT_CONFIGMAP, data={"config.yaml": "version: v1\nmig-configs:\n  mine: []\n"})
    kube.inject_conflicts("nodes", "gpu-a", 3)
    kube.inject_fault(409, method="PUT", path_contains=f"/configmaps/{GPUPILOT_CONFIGMAP}", count=1)
    kube.inject_fault(409, method="PATCH", path_contains="/clusterpolicies/", count=1)
    report, _ = run_apply(kube, make_plan([Change("gpu-a", "all-1g.10gb", GOOD)]))
    assert report.ok
    assert all(
        f.count == 0 for f in kube.api.faults if f.method == "PATCH" or "configmaps" in f.path_contains
    )
    assert "mine" in configs_in(kube, GPUPILOT_CONFIGMAP)
    conflicts = [r for r in kube.api.request_log if r[0] == "PATCH" and "/nodes/gpu-a" in r[1]]
    assert len(conflicts) >= 3 + 4  # 3 refused + cordon, drained, relabel, finish


@pytest.mark.slow
def test_nodes_changed_since_the_plan_are_skipped_with_a_reason(kube):
    seed_node(kube, "gpu-a")
    seed_node(kube, "gpu-b", config="all-balanced")
    plan = make_plan(
        [
            Change("gpu-a", "all-1g.10gb", GOOD),
            Change("gpu-b", "all-1g.10gb", GOOD),
            Change("gone", "x", GOOD),
        ]
    )
    report, _ = run_apply(kube, plan)
    by_node = {o.node: o for o in report.outcomes}
    assert by_node["gpu-a"].result == "applied"
    assert by_node["gpu-b"].result == "skipped" and "changed since the plan" in by_node["gpu-b"].reason
    assert "'all-balanced'" in by_node["gpu-b"].reason
    assert by_node["gone"].result == "skipped" and by_node["gone"].reason == "node not found"
    assert kube.actions(name="gpu-b", verb="patch") == [] and len(kube.pods(node="gpu-b")) == 3


@pytest.mark.slow
def test_pdb_blocking_eviction_times_out_and_rolls_back(kube):
    seed_node(kube, "gpu-a", pods=1, app="critical")
    kube.add_pdb("critical", namespace="ml", match_labels={"app": "critical"}, min_available=1)
    settings = dataclasses.replace(FAST, eviction_timeout_s=0.3)
    report, _ = run_apply(kube, make_plan([Change("gpu-a", "all-1g.10gb", GOOD)]), settings)
    out = report.outcomes[0]
    assert out.result == "rolled-back"
    assert "pods still hold the GPUs" in out.reason and "ml/gpu-a-infer-0" in out.reason
    assert "disruption budget" in out.reason
    assert len(kube.actions(verb="evict-refused")) >= 2  # retried on 429
    assert kube.labels("gpu-a")[proto.CONFIG_LABEL] == "all-1g.10gb"
    assert not kube.node("gpu-a")["spec"].get("unschedulable")
    assert [p["metadata"]["name"] for p in kube.pods(node="gpu-a")] == ["gpu-a-cpu-job", "gpu-a-infer-0"]
    assert any(e["type"] == "Warning" for e in kube.events(involving="gpu-a"))


@pytest.mark.slow
def test_waits_for_terminating_pods_and_passes_through_rebooting():
    settings = MigManagerSettings(with_reboot=True)
    with KubeDouble(mig_manager=settings, pod_termination_s=0.2) as kube:
        seed_node(kube, "gpu-a", config="all-disabled")
        report, lines = run_apply(kube, make_plan([Change("gpu-a", "all-disabled", GOOD)]))
        assert report.ok, report.outcomes
        states = [m for n, m in lines if m.startswith(proto.STATE_LABEL)]
        assert states == [f"{proto.STATE_LABEL}={s}" for s in ("pending", "rebooting", "success")]


@pytest.mark.slow
def test_manager_too_slow_times_out_and_rolls_back():
    with KubeDouble(mig_manager=MigManagerSettings(apply_s=1.5)) as kube:
        seed_node(kube, "gpu-a", pods=0)
        settings = dataclasses.replace(FAST, timeout_s=0.4)
        report, _ = run_apply(kube, make_plan([Change("gpu-a", "all-1g.10gb", GOOD)]), settings)
        assert report.outcomes[0].result == "rolled-back"
        assert (
            "timed out after 0.4s waiting for nvidia.com/mig.config.state=success (last state pending)"
            in report.outcomes[0].reason
        )
        assert kube.labels("gpu-a")[proto.CONFIG_LABEL] == "all-1g.10gb"


@pytest.mark.slow
def test_node_whose_mig_manager_does_not_offer_the_layout_is_not_touched(kube):
    """The per-node ConfigMap (MIG Manager v26.3+) is the authority: no cordon, no eviction, no relabel."""
    seed_node(kube, "gpu-a")
    seed_node(kube, "gpu-b")
    offered = {"1g.10gb": 7, "2g.20gb": 3, "3g.40gb": 2, "7g.80gb": 1}  # this driver lists no 4g, and 1g ≤ 7
    doc = {
        "version": "v1",
        "mig-configs": {
            f"all-{n}": [{"devices": "all", "mig-enabled": True, "mig-devices": {n: c}}]
            for n, c in offered.items()
        },
    }
    kube.add_configmap("gpu-a-mig-config", data={"config.yaml": yaml.safe_dump(doc)})
    kube.add_configmap("gpu-b-mig-config", data={"config.yaml": yaml.safe_dump(doc)})
    plan = make_plan(
        [Change("gpu-a", "all-1g.10gb", {"4g.40gb": 1, "3g.40gb": 1}), Change("gpu-b", "all-1g.10gb", GOOD)]
    )
    report, lines = run_apply(kube, plan, dataclasses.replace(FAST, max_parallel=2))
    outcome = {o.node: o for o in report.outcomes}
    assert outcome["gpu-a"].result == "skipped"
    assert (
        "is not offered by the node's MIG Manager: profile 4g.40gb is not offered on node gpu-a"
        in outcome["gpu-a"].reason
    )
    assert not kube.node("gpu-a")["spec"].get("unschedulable")
    assert kube.labels("gpu-a")[proto.CONFIG_LABEL] == "all-1g.10gb"
    assert not kube.actions(verb="evict", name="gpu-a-infer-0") and kube.actions(
        verb="evict", name="gpu-b-infer-0"
    )
    assert outcome["gpu-b"].result == "applied"  # its layout uses offered profiles only
    assert any(node == "gpu-a" and msg.startswith("skipped: ") for node, msg in lines)


def test_a_merged_file_is_rendered_once_per_content() -> None:
    """The operator's whole default file is re-rendered on every apply unless its text is reused: the
    same content gives the same (cached) text, any change in content a new one, 1 and "1" apart."""
    configs = default_mig_configs()
    first = configmap.merge(existing=[configs], wanted={}).render()
    again = configmap.merge(existing=[dict(configs)], wanted={}).render()
    assert again is first and yaml.safe_load(first) == {"version": "v1", "mig-configs": configs}
    grown = configmap.merge(
        existing=[configs], wanted={"gpupilot-x": [{"devices": "all", "mig-enabled": False}]}
    )
    assert "gpupilot-x" in grown.render() and "gpupilot-x" not in first
    as_int = configmap.Merge({"c": [{"devices": [1]}]}, (), (), ()).render()
    as_str = configmap.Merge({"c": [{"devices": ["1"]}]}, (), (), ()).render()
    assert yaml.safe_load(as_int) != yaml.safe_load(as_str)
