"""docs/uninstall.md followed on the real control plane: a real ``apply`` (the chart's rightsizer
token) re-partitions a node, moves its workload to another MIG profile and re-points the
ClusterPolicy; then the page's own shell blocks run, section by section, with the real ``kubectl``
and the placeholders filled as a user fills them (the node, the workload and the moves read from the
node's ``gpupilot.io/workloads`` annotation). The cluster must end as the page promises: the node on
its previous config and the MIG Manager stand-in reporting it applied, no ``gpupilot.io/``
annotation left, the ClusterPolicy pointing where it did, the workload Running on its previous
resource with its mark gone, and the rightsizer's run-time objects deleted.

The release itself stays (other tests share it): section 1 pauses the shared release and the test
resumes it after; the release-namespace block of section 4 runs against a namespace standing in for
an uninstalled release, holding the objects the page says stay there."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from devkit import gobuild
from devkit.cluster.nodes import CLUSTER_POLICY, DEFAULT_CONFIGMAP, OPERATOR_NAMESPACE
from rightsizer.apply import protocol as proto
from rightsizer.apply import record
from rightsizer.apply import workloads as wl
from rightsizer.apply.configmap import GPUPILOT_CONFIGMAP
from rightsizer.apply.lease import LEASE_NAME as APPLY_LEASE
from rightsizer.serve.leader import LEASE_NAME as LEADER_LEASE
from rightsizer.serve.ledger import CONFIGMAP as LEDGER
from rightsizer.serve.stopsignal import ANN_PAUSE
from tests.deploy.test_helm import run_helm
from tests.kube import world
from tests.kube.conftest import REPO, RealCluster
from tests.kube.test_apply import MIG3, SETTINGS, _apply
from tests.support.rightsizer.apply_support import resize_plan

PAGE = REPO / "docs" / "uninstall.md"
PREVIOUS = "all-3g.40gb"


def page_sections() -> dict[int, list[str]]:
    """Section number → its ``sh`` blocks, in page order."""
    out: dict[int, list[str]] = {}
    number = 0
    for part in re.split(r"^## ", PAGE.read_text(), flags=re.M)[1:]:
        head = re.match(r"(\d+)\.", part)
        number = int(head.group(1)) if head else number
        out.setdefault(number, []).extend(re.findall(r"```sh\n(.*?)```", part, re.S))
    return out


def fill(script: str, values: dict[str, str]) -> str:
    """Each ``NAME=placeholder`` assignment of the page given the user's value (one each, or the page drifted)."""
    for name, value in values.items():
        script, n = re.subn(rf"(?<![\w$]){name}=\S+", f"{name}={value}", script)
        assert n == 1, f"{PAGE.name}: expected one assignment {name}=… in\n{script}"
    return script


def run(cluster: RealCluster, script: str, *, timeout: float = 120) -> str:
    """``script`` in bash as a user's shell runs it, stopping at the first failing command."""
    env = {
        **os.environ,
        "PATH": f"{gobuild.binary('kube', build_missing=False).parent}{os.pathsep}{os.environ['PATH']}",
        "KUBECONFIG": str(cluster.kubeconfig),
    }
    res = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=timeout,
    )
    assert res.returncode == 0, (
        f"{PAGE.name}: this block failed:\n{script}\n{res.stdout[-800:]}{res.stderr[-1500:]}"
    )
    return res.stdout


def pointed(cluster: RealCluster) -> str:
    policy = cluster.kube.get("nvidia.com/v1", "ClusterPolicy", CLUSTER_POLICY) or {}
    return str(((policy.get("spec") or {}).get("migManager") or {}).get("config", {}).get("name", ""))


def release_objects(cluster: RealCluster, namespace: str) -> set[tuple[str, str]]:
    """What section 4 says stays in the release's namespace, made there: the run-time objects under
    the names serve gives them, the PVC as the chart renders it with persistence."""
    res = run_helm("template", "gpupilot", str(world.CHART), "--namespace", world.RELEASE_NS,
                   "--set", "rightsizer.persistence.enabled=true")  # fmt: skip
    assert res.returncode == 0, res.stderr
    rendered = [d for d in yaml.safe_load_all(res.stdout) if d]
    made = {("Lease", LEADER_LEASE), ("ConfigMap", LEDGER)}
    cluster.kube.apply({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                        "metadata": {"name": LEADER_LEASE, "namespace": namespace}, "spec": {}})  # fmt: skip
    cluster.kube.apply({"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": LEDGER, "namespace": namespace}, "data": {}})  # fmt: skip
    for claim in (d for d in rendered if d["kind"] == "PersistentVolumeClaim"):
        claim["metadata"]["namespace"] = namespace
        cluster.kube.apply(claim)
        made.add(("PersistentVolumeClaim", claim["metadata"]["name"]))
    assert any(k == "PersistentVolumeClaim" for k, _ in made), "the chart renders the reports' claim"
    pods = {d["metadata"]["name"] for d in rendered if d["kind"] == "Pod"}
    assert pods, "the chart renders its helm test Pod"
    return made | {("Pod", p) for p in pods}


def test_the_uninstall_page_undoes_what_auto_apply_changed(
    real_cluster: RealCluster, namespace: str, rightsizer: Path
) -> None:
    started = time.monotonic()
    kube = real_cluster.kube
    # a cluster as the GPU Operator installs it: its MIG Manager reads the operator's own ConfigMap
    kube.merge_patch("nvidia.com/v1", "ClusterPolicy", CLUSTER_POLICY,
                     {"spec": {"migManager": {"config": {"name": DEFAULT_CONFIGMAP}}}})  # fmt: skip
    node = f"{namespace[:40]}-gpu".strip("-")
    world.add_gpu_node(real_cluster, node, config=PREVIOUS)
    world.deployment(real_cluster, namespace, "reports", resources={MIG3: 1}, node=node)
    (pod,) = world.wait(
        lambda: world.running_pods(real_cluster, namespace, "reports"), what="reports Running"
    )
    plan = resize_plan(node, PREVIOUS, {"1g.10gb": 7}, [(namespace, pod["metadata"]["name"], "1g.10gb")])
    (out,) = _apply(rightsizer, plan, SETTINGS).outcomes
    assert out.result == "applied", out
    assert pointed(real_cluster) == GPUPILOT_CONFIGMAP, "apply re-pointed the ClusterPolicy"
    target = plan.nodes[0].config_name
    sections = page_sections()
    assert sorted(sections)[:4] == [1, 2, 3, 4] and all(sections[n] for n in (1, 2, 3, 4)), sections
    release_cm = ("v1", "ConfigMap", "gpupilot-rightsizer", world.RELEASE_NS)
    stand_in = f"{namespace}-rel"
    try:
        # 1. stop auto-apply: the pause reaches the release's ConfigMap; no apply holds the Lease
        said = run(real_cluster, "\n".join(sections[1]))
        annotations = (kube.get(*release_cm) or {}).get("metadata", {}).get("annotations") or {}
        assert annotations.get(ANN_PAUSE) == "paused", annotations
        assert said.splitlines()[-1].strip() == "", f"the apply Lease has no holder: {said!r}"

        # 2. what auto-apply changed, as the page shows it
        said = run(real_cluster, "\n".join(sections[2]))
        row = next((line.split() for line in said.splitlines() if line.startswith(node + " ")), None)
        assert row == [node, target, PREVIOUS, "done"], said
        assert f"Deployment/{namespace}/reports" in said.splitlines(), said
        assert said.splitlines()[-1] == GPUPILOT_CONFIGMAP, said

        # 3. the node, its workload and the ClusterPolicy put back, as a user fills the blocks in
        annotated = (kube.get("v1", "Node", node) or {})["metadata"]["annotations"]
        (change,) = wl.decode(annotated[wl.ANN_WORKLOADS])
        ((before, after, count),) = change.moves
        assert (change.kind, before) == ("Deployment", MIG3), change
        script = fill(
            "\n".join(sections[3]),
            {
                "NODE": node,
                "NS": change.namespace,
                "WORKLOAD": f"{change.kind.lower()}/{change.name}",
                "CONTAINER": "main",
                "BEFORE": before,
                "AFTER": after,
                "COUNT": str(count),
            },
        )
        run(real_cluster, script, timeout=240)

        obj = kube.get("v1", "Node", node) or {}
        labels = obj["metadata"]["labels"]
        assert labels[proto.CONFIG_LABEL] == PREVIOUS and labels[proto.STATE_LABEL] == "success", labels
        assert real_cluster.manager.applied[node] == PREVIOUS
        last = [r for r in real_cluster.manager.log if r.node == node][-1]
        assert (last.config, last.state) == (PREVIOUS, "success"), last
        assert obj["status"]["allocatable"].get(MIG3) == "2", obj["status"]["allocatable"]
        left = [k for k in obj["metadata"].get("annotations") or {} if k.startswith("gpupilot.io/")]
        assert left == [], f"annotations the page leaves: {left}"
        assert not obj["spec"].get("unschedulable"), "uncordoned"
        assert pointed(real_cluster) == DEFAULT_CONFIGMAP
        dep = kube.get("apps/v1", "Deployment", "reports", namespace) or {}
        container = dep["spec"]["template"]["spec"]["containers"][0]
        assert container["resources"] == {"limits": {MIG3: "1"}, "requests": {MIG3: "1"}}, container
        assert wl.ANN_CHANGED_BY not in (dep["metadata"].get("annotations") or {})
        (now,) = world.wait(
            lambda: world.running_pods(real_cluster, namespace, "reports"), what="reports Running on 3g.40gb"
        )
        assert now["spec"]["nodeName"] == node and world.limits_of(now["spec"]) == {MIG3: "1"}

        # 4. what stays: the operator namespace's run-time objects, then the release's
        operator_block, release_block = sections[4]
        run(real_cluster, operator_block)
        for kind, api, name in (
            ("ConfigMap", "v1", GPUPILOT_CONFIGMAP),
            ("ConfigMap", "v1", record.CONFIGMAP),
            ("Lease", "coordination.k8s.io/v1", APPLY_LEASE),
        ):
            assert kube.get(api, kind, name, OPERATOR_NAMESPACE) is None, f"{kind} {name} left"
        assert kube.get("v1", "ConfigMap", DEFAULT_CONFIGMAP, OPERATOR_NAMESPACE) is not None
        kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": stand_in}})
        made = release_objects(real_cluster, stand_in)
        named = {
            (kind, name)
            for kind, name in re.findall(r"delete (lease|configmap|pod|pvc) (\S+)", release_block)
        }
        kinds = {"lease": "Lease", "configmap": "ConfigMap", "pod": "Pod", "pvc": "PersistentVolumeClaim"}
        assert {(kinds[k], n) for k, n in named} == made, f"the page names {named}, the release leaves {made}"
        filled, n = re.subn(r"(-n |namespace )gpupilot\b", rf"\g<1>{stand_in}", release_block)
        assert n == len(release_block.strip().splitlines()), release_block
        run(real_cluster, filled)
        gone = kube.get("v1", "Namespace", stand_in)
        assert gone is None or gone["metadata"].get("deletionTimestamp"), gone
    finally:
        real_cluster.kubectl("-n", world.RELEASE_NS, "annotate", "configmap", "gpupilot-rightsizer",
                             f"{ANN_PAUSE}-", check=False)  # fmt: skip
        real_cluster.kubectl(
            "delete", "namespace", stand_in, "--wait=false", "--ignore-not-found", check=False
        )
    print(f"uninstall page followed in {time.monotonic() - started:.0f}s")


@pytest.fixture(scope="module")
def rightsizer(real_cluster: RealCluster, chart: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The chart's rightsizer (auto-apply) installed; a kubeconfig with its ServiceAccount's token."""
    where = tmp_path_factory.mktemp("rightsizer")
    return world.service_account_kubeconfig(real_cluster, where, world.RELEASE_NS, "gpupilot-rightsizer")
