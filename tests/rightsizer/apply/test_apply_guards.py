"""apply refuses what it must not do before it touches anything: a plan it cannot trust (edited,
impossible, duplicated, aimed at shared configs), a --namespace or ConfigMap that disagrees with the
ClusterPolicy, a repoint without --repoint-cluster-policy; and undoes its ConfigMap/ClusterPolicy
changes when no node took them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from rightsizer.apply import protocol as proto
from rightsizer.apply.applier import Applier, ApplyError
from rightsizer.apply.configmap import GPUPILOT_CONFIGMAP
from rightsizer.cli import main
from rightsizer.clients.kube import Kube
from rightsizer.plan.model import PlanError, plan_from_dict, plan_to_dict
from tests.support.kubedouble import KubeDouble
from tests.support.rightsizer.apply_support import (
    FAST,
    GOOD,
    Change,
    break_node,
    make_plan,
    seed_node,
    write_plan,
)

WRITES = ("create", "update", "patch", "delete", "evict")


@pytest.fixture(autouse=True)
def _gpu_a(kube: KubeDouble) -> None:
    """Every test here starts from the empty double (tests/conftest.py) with node gpu-a seeded."""
    seed_node(kube, "gpu-a")


def writes(kube: KubeDouble) -> list[str]:
    return [f"{a.verb} {a.resource}/{a.name}" for a in kube.actions() if a.verb in WRITES]


def apply(kube: KubeDouble, plan, settings=FAST):
    return Applier(Kube(kube.api_client()), plan, settings, progress=lambda n, m: None).run()


def edited(plan, change):
    doc = plan_to_dict(plan)
    change(doc)
    return plan_from_dict(doc, source="edited")


def _swap_layout(doc):
    name = doc["nodes"][0]["config_name"]
    for where in (doc["mig_parted_config"]["mig-configs"], doc["nodes"][0]["config_document"]["mig-configs"]):
        where[name][0]["mig-devices"] = {"7g.80gb": 1}


def _shared_name(doc):
    old = doc["nodes"][0]["config_name"]
    for where in (doc["mig_parted_config"]["mig-configs"], doc["nodes"][0]["config_document"]["mig-configs"]):
        where["all-1g.10gb"] = where.pop(old)
    doc["nodes"][0]["config_name"] = "all-1g.10gb"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("plan_of", "message"),
    [
        (
            lambda: make_plan([Change("gpu-a", "all-1g.10gb", {"3g.40gb": 2, "1g.10gb": 1})]),
            "no valid placement",
        ),
        (
            lambda: make_plan([Change("gpu-a", "all-1g.10gb", {"5g.99gb": 1})]),
            "profile 5g.99gb does not exist",
        ),
        (
            lambda: edited(make_plan([Change("gpu-a", "all-1g.10gb", GOOD)]), _swap_layout),
            "does not match its content hash",
        ),
        (
            lambda: edited(make_plan([Change("gpu-a", "all-1g.10gb", GOOD)]), _shared_name),
            "'all-1g.10gb' is not a gpupilot-<hash> config",
        ),
        (
            lambda: make_plan([Change("gpu-a", "all-1g.10gb", GOOD), Change("gpu-a", "all-1g.10gb", GOOD)]),
            "node gpu-a is listed 2 times",
        ),
        (
            lambda: dataclasses.replace(make_plan([Change("gpu-a", "all-1g.10gb", GOOD)]), plan_id="0" * 16),
            "does not match the plan's content",
        ),
    ],
)
def test_untrusted_plans_are_refused_before_any_write(kube, plan_of, message):
    with pytest.raises(PlanError) as err:
        apply(kube, plan_of())
    assert message in str(err.value)
    assert writes(kube) == []


@pytest.mark.slow
def test_an_edited_plan_file_is_exit_2_and_one_line(kube, tmp_path: Path, capsys):
    plan = edited(make_plan([Change("gpu-a", "all-1g.10gb", GOOD)]), _swap_layout)
    path = write_plan(plan, tmp_path / "plan.json")
    cfg = kube.write_kubeconfig(tmp_path / "kc")
    assert main(["apply", "--plan", str(path), "--kubeconfig", str(cfg), "--yes"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "does not match its content hash" in err[0] and str(path) in err[0]
    assert writes(kube) == []


@pytest.mark.slow
def test_a_config_already_in_the_configmap_with_other_content_is_never_changed(kube):
    plan = make_plan([Change("gpu-a", "all-1g.10gb", GOOD)])
    name = plan.nodes[0].config_name
    tampered = {"version": "v1", "mig-configs": {name: [{"devices": "all", "mig-enabled": False}]}}
    kube.add_configmap(GPUPILOT_CONFIGMAP, data={"config.yaml": yaml.safe_dump(tampered)})
    with pytest.raises(ApplyError) as err:
        apply(kube, plan)
    assert f"already holds config {name} with different content" in str(err.value)
    assert writes(kube) == []


@pytest.mark.slow
def test_wrong_namespace_is_refused_from_the_cluster_policy(kube):
    with pytest.raises(ApplyError) as err:
        apply(
            kube, make_plan([Change("gpu-a", "all-1g.10gb", GOOD)]), dataclasses.replace(FAST, namespace="ml")
        )
    assert "runs in namespace gpu-operator, not ml: pass --namespace gpu-operator" in str(err.value)
    assert writes(kube) == []
    # an operator that does not publish its namespace: the ConfigMap it points at must be there
    kube.store.update("nvidia.com/clusterpolicies", "", "cluster-policy", lambda cp: cp.pop("status"))
    with pytest.raises(ApplyError) as err:
        apply(
            kube, make_plan([Change("gpu-a", "all-1g.10gb", GOOD)]), dataclasses.replace(FAST, namespace="ml")
        )
    assert "ConfigMap default-mig-parted-config, which is not in namespace ml" in str(err.value)
    assert writes(kube) == []


@pytest.mark.slow
def test_no_repoint_without_the_flag(kube):
    settings = dataclasses.replace(FAST, repoint_cluster_policy=False)
    with pytest.raises(ApplyError) as err:
        apply(kube, make_plan([Change("gpu-a", "all-1g.10gb", GOOD)]), settings)
    assert "pass --repoint-cluster-policy" in str(err.value)
    assert writes(kube) == []
    kube.add_configmap("custom", data={"config.yaml": "version: v1\nmig-configs: {}\n"})
    kube.store.update(
        "nvidia.com/clusterpolicies",
        "",
        "cluster-policy",
        lambda cp: cp["spec"]["migManager"]["config"].update(name="custom"),
    )
    with pytest.raises(ApplyError) as err:
        apply(
            kube,
            make_plan([Change("gpu-a", "all-1g.10gb", GOOD)]),
            dataclasses.replace(settings, configmap="mine"),
        )
    assert "writing mine needs the ClusterPolicy repointed" in str(err.value)
    assert "or --configmap custom" in str(err.value)
    assert writes(kube) == []


@pytest.mark.slow
def test_a_run_no_node_took_undoes_the_repoint(kube):
    break_node(kube, "gpu-a")
    report = apply(kube, make_plan([Change("gpu-a", "all-1g.10gb", GOOD)]))
    assert [o.result for o in report.outcomes] == ["rolled-back"]
    assert kube.cluster_policy()["spec"]["migManager"]["config"]["name"] == "default-mig-parted-config"
    assert "ClusterPolicy cluster-policy points at default-mig-parted-config again" in report.configs_restored
    assert f"ConfigMap {GPUPILOT_CONFIGMAP} (created by this run) left in place" in report.configs_restored
    kube.wait_for(lambda: kube.labels("gpu-a").get(proto.STATE_LABEL) == "success")
    assert kube.labels("gpu-a")[proto.CONFIG_LABEL] == "all-1g.10gb"


@pytest.mark.slow
def test_a_run_no_node_took_restores_the_configmap_it_replaced(kube):
    before = "version: v1\nmig-configs:\n  all-1g.10gb:\n  - devices: all\n    mig-enabled: true\n    mig-devices: {1g.10gb: 7}\n"
    kube.add_configmap("custom", data={"config.yaml": before})
    kube.store.update(
        "nvidia.com/clusterpolicies",
        "",
        "cluster-policy",
        lambda cp: cp["spec"]["migManager"]["config"].update(name="custom"),
    )
    break_node(kube, "gpu-a")
    report = apply(kube, make_plan([Change("gpu-a", "all-1g.10gb", GOOD)]))
    assert [o.result for o in report.outcomes] == ["rolled-back"]
    assert report.configs_restored == "ConfigMap custom restored to its previous content"
    assert kube.configmap("custom")["data"]["config.yaml"] == before


@pytest.mark.slow
def test_configs_stay_when_a_node_took_them(kube):
    seed_node(kube, "gpu-b")
    break_node(kube, "gpu-b")
    plan = make_plan([Change("gpu-a", "all-1g.10gb", GOOD), Change("gpu-b", "all-1g.10gb", GOOD)])
    report = apply(kube, plan)
    assert [o.result for o in report.outcomes] == ["applied", "rolled-back"]
    assert report.configs_restored == ""
    assert kube.cluster_policy()["spec"]["migManager"]["config"]["name"] == GPUPILOT_CONFIGMAP
