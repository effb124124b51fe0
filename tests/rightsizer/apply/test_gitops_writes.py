"""``--workloads gitops`` writes only inside ``<gitops dir>/<plan id>/``, whole files or none, and a
write that fails — a read-only or full folder, a link or a folder in the way — ends the node's run in
one line with everything apply had changed rolled back, the ClusterPolicy repointed included."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from rightsizer.apply import gitops
from rightsizer.apply import protocol as proto
from rightsizer.apply.workloads import Change
from tests.support.kubedouble import KubeDouble
from tests.support.rightsizer.apply_support import FAST, resize_plan, run_apply

MIG1, MIG3 = "nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb"
LIVE = {
    "kind": "Deployment",
    "metadata": {"name": "reports", "namespace": "ml"},
    "spec": {"template": {"spec": {"containers": [{"name": "main", "resources": {"limits": {MIG3: "1"}}}]}}},
}


def _change() -> Change:
    return Change(
        kind="Deployment", namespace="ml", name="reports", replicas=1, selector={}, moves=((MIG3, MIG1, 1),)
    )


def test_patches_are_written_inside_the_plan_folder(tmp_path: Path) -> None:
    paths = gitops.write_patches(tmp_path, "p-1", [(_change(), LIVE)])
    assert [p.name for p in paths] == [
        "ml.deployment.reports.yaml",
        "kustomization-patches.yaml",
        "workloads.diff",
    ]
    assert all(p.parent == tmp_path / "p-1" and p.is_file() for p in paths)
    assert not [p for p in (tmp_path / "p-1").iterdir() if p.name.startswith(".")]  # no temporary left


def test_a_plan_folder_that_is_a_link_is_refused_and_nothing_written_outside(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "git").mkdir()
    (tmp_path / "git" / "p-1").symlink_to(outside)
    with pytest.raises(gitops.GitopsWriteFailed) as err:
        gitops.write_patches(tmp_path / "git", "p-1", [(_change(), LIVE)])
    assert str(err.value) == (
        f"cannot write {tmp_path}/git/p-1: not a folder (a symbolic link or a file is in its place); "
        "nothing was written"
    )
    assert list(outside.iterdir()) == []


def test_a_gitops_dir_that_is_a_link_or_a_plan_id_that_leaves_it_is_refused(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "git").symlink_to(tmp_path / "real")
    with pytest.raises(gitops.GitopsWriteFailed, match="it is a symbolic link"):
        gitops.write_patches(tmp_path / "git", "p-1", [(_change(), LIVE)])
    for plan_id in ("..", "../x", "a/b"):
        with pytest.raises(gitops.GitopsWriteFailed, match="is not a folder name"):
            gitops.write_patches(tmp_path / "real", plan_id, [(_change(), LIVE)])
    assert list((tmp_path / "real").iterdir()) == []


def test_a_patch_name_that_is_a_link_is_refused_and_what_was_added_removed(tmp_path: Path) -> None:
    folder = tmp_path / "p-1"
    folder.mkdir()
    secret = tmp_path / "secret.yaml"
    secret.write_text("mine\n")
    (folder / "kustomization-patches.yaml").symlink_to(secret)
    with pytest.raises(gitops.GitopsWriteFailed, match="a symbolic link is in its place"):
        gitops.write_patches(tmp_path, "p-1", [(_change(), LIVE)])
    assert secret.read_text() == "mine\n"
    assert sorted(p.name for p in folder.iterdir()) == [
        "kustomization-patches.yaml"
    ]  # the patch added first: gone


@pytest.mark.slow
@pytest.mark.parametrize(
    "obstacle", ["gitops dir is a file", "plan folder is a link", "patch name is a folder"]
)
def test_a_failed_write_rolls_back_the_cluster_policy_in_one_line(tmp_path: Path, obstacle: str) -> None:
    gitops_dir = tmp_path / "git"
    outside = tmp_path / "outside"
    outside.mkdir()
    with KubeDouble() as kube:
        kube.add_node("gpu-a", gpus=1, mig_config="all-3g.40gb")
        kube.add_workload(
            "Deployment", "reports", namespace="ml", replicas=1, resources={MIG3: 1}, node="gpu-a"
        )
        (pod,) = [p["metadata"]["name"] for p in kube.pods(node="gpu-a")]
        plan = resize_plan("gpu-a", "all-3g.40gb", {"1g.10gb": 7}, [("ml", pod, "1g.10gb")])
        if obstacle == "gitops dir is a file":
            gitops_dir.write_text("")
        elif obstacle == "plan folder is a link":
            gitops_dir.mkdir()
            (gitops_dir / plan.plan_id).symlink_to(outside)
        else:
            (gitops_dir / plan.plan_id / "ml.deployment.reports.yaml").mkdir(parents=True)
        settings = dataclasses.replace(
            FAST, settle_timeout_s=5, lease_duration_s=0, workloads="gitops", gitops_dir=gitops_dir
        )
        report, _lines = run_apply(kube, plan, settings)
        (out,) = report.outcomes
        assert out.result == "failed" and "\n" not in out.reason
        assert out.reason.startswith("node unchanged: cannot write ") and "check --gitops-dir" in out.reason
        policy = kube.cluster_policy()
        assert (
            policy is not None
            and policy["spec"]["migManager"]["config"]["name"] == "default-mig-parted-config"
        )
        assert (
            "ClusterPolicy cluster-policy points at default-mig-parted-config again"
            in report.configs_restored
        )
        assert kube.actions(verb="evict") == [] and kube.actions(resource="deployments") == []
        assert not kube.node("gpu-a")["spec"].get("unschedulable")
        assert kube.labels("gpu-a")[proto.CONFIG_LABEL] == "all-3g.40gb"
    assert list(outside.iterdir()) == []
    if obstacle == "patch name is a folder":
        assert sorted(p.name for p in (gitops_dir / plan.plan_id).iterdir()) == ["ml.deployment.reports.yaml"]
