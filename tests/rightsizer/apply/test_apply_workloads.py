"""apply closes the loop: the workloads of resized pods get their new GPU request, the replacements
are scheduled by the double's scheduler on the new layout, and a node is done only when they run;
refusals before any eviction, gitops mode, a kill -9 between the request patch and the relabel,
rollback of templates, and transient API errors on every new call."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml

from rightsizer.apply import protocol as proto
from rightsizer.apply import workloads as wl
from rightsizer.cli import main
from tests.support.kubedouble import KubeDouble
from tests.support.rightsizer.apply_support import (
    FAST,
    break_node,
    resize_plan,
    run_apply,
    write_plan,
)

MIG1, MIG2, MIG3 = "nvidia.com/mig-1g.10gb", "nvidia.com/mig-2g.20gb", "nvidia.com/mig-3g.40gb"
SETTINGS = dataclasses.replace(FAST, settle_timeout_s=5, lease_duration_s=0)
REPO = Path(__file__).resolve().parents[3]


def live_pods(kube: KubeDouble, namespace: str = "ml") -> list[dict[str, Any]]:
    return [p for p in kube.pods(namespace=namespace) if not p["metadata"].get("deletionTimestamp")]


def limits(pod_spec: Mapping[str, Any]) -> dict[str, str]:
    return dict(pod_spec["containers"][0]["resources"]["limits"])


def template_limits(kube: KubeDouble, name: str, kind: str = "Deployment") -> dict[str, str]:
    obj = kube.workload(kind, name, namespace="ml")
    assert obj is not None
    return limits(obj["spec"]["template"]["spec"])


def seed_reports(kube: KubeDouble, *, replicas: int = 1, pinned: bool = True) -> list[str]:
    """gpu-a (one H100 as two 3g.40gb) runs Deployment ml/reports on 3g.40gb; returns its pod names."""
    kube.add_node("gpu-a", gpus=1, mig_config="all-3g.40gb")
    kube.add_workload(
        "Deployment",
        "reports",
        namespace="ml",
        replicas=replicas,
        resources={MIG3: 1},
        node="gpu-a" if pinned else None,
    )
    return [p["metadata"]["name"] for p in kube.pods(node="gpu-a")]


@pytest.mark.slow
def test_a_workload_shrunk_from_3g_to_1g_ends_running_on_a_1g_slot():
    with KubeDouble() as kube:
        (pod,) = seed_reports(kube)
        plan = resize_plan("gpu-a", "all-3g.40gb", {"1g.10gb": 7}, [("ml", pod, "1g.10gb")])
        report, _ = run_apply(kube, plan, SETTINGS)
        out = report.outcomes[0]
        assert out.result == "applied", out
        (now,) = live_pods(kube)
        assert now["metadata"]["name"] != pod
        assert now["spec"]["nodeName"] == "gpu-a" and now["status"]["phase"] == "Running"
        assert limits(now["spec"]) == {MIG1: "1"}
        assert template_limits(kube, "reports") == {MIG1: "1"}
        assert kube.node("gpu-a")["status"]["allocatable"][MIG1] == "7"
        (row,) = out.workloads
        assert (row.change.ref, row.change.old_request, row.change.new_request) == (
            "deployment/ml/reports",
            f"{MIG3}: 1",
            f"{MIG1}: 1",
        )
        assert (row.running, row.desired) == (1, 1)
        # the safe order: the template first, then the eviction, then the relabel
        patched = kube.actions(verb="patch", resource="deployments")[0].seq
        evicted = kube.actions(verb="evict")[0].seq
        relabelled = next(
            a.seq
            for a in kube.actions(verb="patch", resource="nodes")
            if proto.CONFIG_LABEL in str(a.detail.get("body", ""))
        )
        assert patched < evicted < relabelled
        notes = kube.annotations("gpu-a")
        assert notes[proto.ANN_STEP] == "done"
        assert [c.ref for c in wl.decode(notes[wl.ANN_WORKLOADS])] == ["deployment/ml/reports"]


@pytest.mark.slow
def test_a_new_request_that_fits_nowhere_is_refused_before_any_eviction():
    with KubeDouble() as kube:
        kube.add_node("gpu-a", gpus=1, mig_config="all-3g.40gb")
        kube.add_node("gpu-b", gpus=1, mig_config="all-3g.40gb")
        kube.add_workload("Deployment", "reports", namespace="ml", replicas=3, resources={MIG3: 1})
        on_a = [p["metadata"]["name"] for p in kube.pods(node="gpu-a")]
        assert len(on_a) == 2
        # two 1g slots on gpu-a, but the template change re-creates all three replicas on 1g
        plan = resize_plan(
            "gpu-a", "all-3g.40gb", {"3g.40gb": 1, "1g.10gb": 2}, [("ml", n, "1g.10gb") for n in on_a]
        )
        before = kube.snapshot()
        report, _ = run_apply(kube, plan, SETTINGS)
        out = report.outcomes[0]
        assert out.result == "failed"
        assert out.reason == (
            f"nothing changed: the replacements would not fit: {MIG1}: 3 needed (deployment/ml/reports ×3) "
            "but 2 free after the change (gpu-a: 2, other nodes: 0)"
        )
        assert kube.actions(verb="evict") == [] and kube.actions(resource="deployments") == []
        assert kube.node("gpu-a") == before[("/nodes", "", "gpu-a")]  # not even cordoned


@pytest.mark.slow
def test_a_bare_pod_whose_profile_changes_is_refused_with_what_to_do():
    with KubeDouble() as kube:
        kube.add_node("gpu-a", gpus=1, mig_config="all-3g.40gb")
        kube.add_pod("notebook", namespace="ml", node="gpu-a", resources={MIG3: 1}, owner=None)
        plan = resize_plan("gpu-a", "all-3g.40gb", {"1g.10gb": 7}, [("ml", "notebook", "1g.10gb")])
        report, _ = run_apply(kube, plan, SETTINGS)
        out = report.outcomes[0]
        assert out.result == "failed"
        assert "pod ml/notebook has no controller (a bare pod is not re-created after eviction)" in out.reason
        assert f"it would need {MIG3} → {MIG1}" in out.reason
        assert kube.actions(verb="evict") == []


def sync_from_git(kube: KubeDouble, directory: Path, stop: threading.Event) -> None:
    """What Argo CD or Flux would do once the patches are merged: apply them to the live objects."""
    apps = kubernetes.client.AppsV1Api(kube.api_client())
    while not stop.wait(0.05):
        for path in directory.glob("*/*.deployment.*.yaml"):
            patch = yaml.safe_load(path.read_text())
            meta = patch["metadata"]
            containers = kubernetes.client.ApiClient().sanitize_for_serialization(
                apps.read_namespaced_deployment(meta["name"], meta["namespace"])
            )["spec"]["template"]["spec"]["containers"]
            for want in patch["spec"]["template"]["spec"]["containers"]:
                c = next(c for c in containers if c["name"] == want["name"])
                for part, values in want["resources"].items():
                    merged = {**c["resources"].get(part, {}), **values}
                    c["resources"][part] = {k: v for k, v in merged.items() if v is not None}
            apps.patch_namespaced_deployment(
                meta["name"],
                meta["namespace"],
                {"spec": {"template": {"spec": {"containers": containers}}}},
                _content_type="application/merge-patch+json",
            )
            return


@pytest.mark.slow
def test_gitops_writes_the_patches_and_waits_for_the_live_template(tmp_path):
    with KubeDouble() as kube:
        (pod,) = seed_reports(kube)
        plan = resize_plan("gpu-a", "all-3g.40gb", {"1g.10gb": 7}, [("ml", pod, "1g.10gb")])
        settings = dataclasses.replace(SETTINGS, workloads="gitops", gitops_dir=tmp_path, gitops_timeout_s=10)
        stop = threading.Event()
        syncer = threading.Thread(target=sync_from_git, args=(kube, tmp_path, stop), daemon=True)
        syncer.start()
        try:
            report, lines = run_apply(kube, plan, settings)
        finally:
            stop.set()
            syncer.join(5)
        assert report.outcomes[0].result == "applied", report.outcomes
        folder = tmp_path / plan.plan_id
        wrote = sorted(msg for _, msg in lines if msg.startswith("wrote "))
        assert wrote == sorted(f"wrote {p}" for p in folder.iterdir())  # one line per file
        patch = yaml.safe_load((folder / "ml.deployment.reports.yaml").read_text())
        assert patch["spec"]["template"]["spec"]["containers"] == [
            {
                "name": "main",
                "resources": {"limits": {MIG3: None, MIG1: "1"}, "requests": {MIG3: None, MIG1: "1"}},
            }
        ]
        assert yaml.safe_load((folder / "kustomization-patches.yaml").read_text()) == {
            "patches": [{"path": "ml.deployment.reports.yaml"}]
        }
        diff = (folder / "workloads.diff").read_text()
        assert f"-      {MIG3}: '1'" in diff and f"+      {MIG1}: '1'" in diff
        assert kube.actions(verb="patch", resource="deployments")  # by the syncer, not by apply
        (now,) = live_pods(kube)
        assert limits(now["spec"]) == {MIG1: "1"} and now["spec"]["nodeName"] == "gpu-a"


@pytest.mark.slow
def test_gitops_times_out_cleanly_before_any_eviction(tmp_path):
    with KubeDouble() as kube:
        (pod,) = seed_reports(kube)
        plan = resize_plan("gpu-a", "all-3g.40gb", {"1g.10gb": 7}, [("ml", pod, "1g.10gb")])
        settings = dataclasses.replace(
            SETTINGS, workloads="gitops", gitops_dir=tmp_path, gitops_timeout_s=0.3
        )
        report, _ = run_apply(kube, plan, settings)
        out = report.outcomes[0]
        assert out.result == "rolled-back"
        assert out.reason == (
            f"the live templates did not change within 0.3s: deployment/ml/reports (wants {MIG1}: 1); "
            "merge and sync the written patches, then run apply again"
        )
        assert kube.actions(verb="evict") == [] and kube.actions(resource="deployments") == []
        assert not kube.node("gpu-a")["spec"].get("unschedulable")
        assert kube.labels("gpu-a")[proto.CONFIG_LABEL] == "all-3g.40gb"
        assert [p["metadata"]["name"] for p in live_pods(kube)] == [pod]
        assert (tmp_path / plan.plan_id / "ml.deployment.reports.yaml").is_file()


@pytest.mark.slow
def test_rollback_restores_the_templates_and_the_old_pods_come_back():
    with KubeDouble() as kube:
        (pod,) = seed_reports(kube)
        break_node(kube, "gpu-a")  # the MIG Manager fails after the relabel
        plan = resize_plan("gpu-a", "all-3g.40gb", {"1g.10gb": 7}, [("ml", pod, "1g.10gb")])
        report, _ = run_apply(kube, plan, SETTINGS)
        assert report.outcomes[0].result == "rolled-back"
        assert template_limits(kube, "reports") == {MIG3: "1"}
        assert kube.labels("gpu-a")[proto.CONFIG_LABEL] == "all-3g.40gb"
        assert kube.annotations("gpu-a")[proto.ANN_STEP] == "rolled-back"
        kube.wait_for(
            lambda: (
                [
                    (p["spec"].get("nodeName"), p["status"]["phase"], limits(p["spec"]))
                    for p in live_pods(kube)
                ]
                == [("gpu-a", "Running", {MIG3: "1"})]
            ),
            what="the workload Running on 3g.40gb again",
        )


@pytest.mark.slow
def test_a_workload_that_cannot_settle_rolls_the_node_back_with_the_schedulers_reason():
    """The fit check counts free devices anywhere; a nodeSelector pins the pod to gpu-a, whose new
    layout has no 1g.10gb: the replacement stays Pending, and the post-condition catches it."""
    with KubeDouble() as kube:
        (pod,) = seed_reports(kube)
        kube.add_node("gpu-b", gpus=1, mig_config="all-1g.10gb")
        plan = resize_plan("gpu-a", "all-3g.40gb", {"2g.20gb": 3}, [("ml", pod, "1g.10gb")])
        settings = dataclasses.replace(SETTINGS, settle_timeout_s=0.5)
        report, _ = run_apply(kube, plan, settings)
        out = report.outcomes[0]
        assert out.result == "rolled-back", out
        assert out.reason.startswith(
            "workloads not settled after 0.5s: deployment/ml/reports has 0/1 Running and Ready ("
        )
        assert "Pending (Unschedulable: 0/2 nodes are available:" in out.reason
        assert "1 node(s) didn't match Pod's node affinity/selector" in out.reason
        assert template_limits(kube, "reports") == {MIG3: "1"}
        assert kube.annotations("gpu-a")[proto.ANN_STEP] == "rolled-back"
        assert (out.workloads[0].running, out.workloads[0].desired) == (0, 1)


@pytest.mark.slow
def test_kill_9_between_the_request_patch_and_the_relabel_is_resumed_by_the_next_run(tmp_path):
    with KubeDouble() as kube:
        (pod,) = seed_reports(kube)
        plan_file = write_plan(
            resize_plan("gpu-a", "all-3g.40gb", {"1g.10gb": 7}, [("ml", pod, "1g.10gb")]),
            tmp_path / "plan.json",
        )
        kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig")
        cmd = [
            sys.executable, "-m", "rightsizer", "apply", "--plan", str(plan_file), "--kubeconfig",
            str(kubeconfig), "--configmap-sync", "0", "--repoint-cluster-policy", "--yes",
            "--timeout", "20s", "--settle-timeout", "20s", "--lease-duration", "2s",
        ]  # fmt: skip
        # every eviction answers 503 "come back in 30 s": the run is stuck right after the request patch
        kube.inject_fault(503, path_contains="/eviction", count=None, retry_after_s=30)
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        first = subprocess.Popen(
            cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            kube.wait_for(
                lambda: (
                    kube.annotations("gpu-a").get(proto.ANN_STEP) == "requests-set"
                    and kube.api.faults[0].hits > 0
                ),
                timeout=60,
                what="the first run to patch the template and try to evict",
            )
        finally:
            os.kill(first.pid, signal.SIGKILL)
            first.wait(10)
        assert template_limits(kube, "reports") == {MIG1: "1"}
        assert kube.labels("gpu-a")[proto.CONFIG_LABEL] == "all-3g.40gb"  # not relabelled
        assert kube.node("gpu-a")["spec"]["unschedulable"] is True
        kube.clear_faults()  # the second run waits out the dead run's Lease: 2 s unrenewed
        second = subprocess.run(
            cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False
        )
        assert second.returncode == 0, second.stderr[-3000:]
        assert "resuming after step requests-set" in second.stderr
        assert "deployment/ml/reports" in second.stdout and "1/1" in second.stdout
        assert kube.annotations("gpu-a")[proto.ANN_STEP] == "done"
        (now,) = live_pods(kube)
        assert limits(now["spec"]) == {MIG1: "1"} and now["spec"]["nodeName"] == "gpu-a"
        assert len(kube.actions(verb="patch", resource="deployments")) == 1  # not patched twice


NEW_CALLS = ("/apis/apps/v1/", "/api/v1/nodes", "/api/v1/pods", "/api/v1/namespaces/ml/pods")


def resize_run(
    fault: tuple[int, str, str, int] | None = None,
) -> tuple[str, list[tuple[str, str]], bool, dict[str, str]]:
    with KubeDouble() as kube:
        (pod,) = seed_reports(kube)
        injected = None
        if fault is not None:
            status, method, path, skip = fault
            injected = kube.inject_fault(
                status, method=method, path_contains=path, skip=skip, retry_after_s=0
            )
        plan = resize_plan("gpu-a", "all-3g.40gb", {"1g.10gb": 7}, [("ml", pod, "1g.10gb")])
        report, _ = run_apply(kube, plan, SETTINGS)
        calls = [(m, urllib.parse.urlsplit(p).path) for m, p in kube.api.request_log]
        (now,) = live_pods(kube) or [{"spec": {"containers": [{"resources": {"limits": {}}}]}}]
        taken = injected is not None and injected.hits > injected.skip
        return report.outcomes[0].result, calls, taken, limits(now["spec"])


@pytest.mark.slow
def test_a_transient_error_on_any_new_call_changes_nothing_in_the_outcome():
    """429 and 503 (``Retry-After: 0``: waiting proves nothing here) once on each call apply makes for
    the workloads: owner reads, template patches, node and pod lists."""
    _, calls, _, _ = resize_run()
    cases = []
    for method, path in dict.fromkeys(calls):
        if path.startswith(NEW_CALLS) and not path.endswith("/eviction"):
            cases += [(status, method, path, 0) for status in (503, 429)]
    assert len(cases) >= 10
    assert any("/deployments/reports" in c[2] and c[1] == "PATCH" for c in cases)
    assert any(c[2] == "/api/v1/namespaces/ml/pods" for c in cases)
    failures = []
    for case in cases:
        result, _, taken, now = resize_run(case)
        if (result, now) != ("applied", {MIG1: "1"}) or not taken:
            failures.append(f"{case}: {result} {now} taken={taken}")
    assert failures == []


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["StatefulSet"])
def test_a_statefulset_is_resized_too(kind):
    with KubeDouble() as kube:
        kube.add_node("gpu-a", gpus=1, mig_config="all-3g.40gb")
        kube.add_workload(kind, "db", namespace="ml", replicas=1, resources={MIG3: 1}, node="gpu-a")
        plan = resize_plan("gpu-a", "all-3g.40gb", {"1g.10gb": 7}, [("ml", "db-0", "1g.10gb")])
        report, _ = run_apply(kube, plan, SETTINGS)
        assert report.outcomes[0].result == "applied", report.outcomes
        assert template_limits(kube, "db", kind) == {MIG1: "1"}
        (now,) = live_pods(kube)
        assert now["metadata"]["name"] == "db-0" and limits(now["spec"]) == {MIG1: "1"}


@pytest.mark.slow
def test_dry_run_prints_the_template_patches_and_the_script_runs_as_printed(tmp_path, capsys):
    with KubeDouble() as kube:
        (pod,) = seed_reports(kube)
        plan_file = write_plan(
            resize_plan("gpu-a", "all-3g.40gb", {"1g.10gb": 7}, [("ml", pod, "1g.10gb")]),
            tmp_path / "plan.json",
        )
        kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig")
        before = kube.snapshot()
        args = [
            "apply",
            "--plan",
            str(plan_file),
            "--kubeconfig",
            str(kubeconfig),
            "--repoint-cluster-policy",
        ]
        assert main([*args, "--configmap-sync", "0", "--settle-timeout", "60s", "--dry-run"]) == 0
        script = capsys.readouterr().out
        assert kube.snapshot() == before
        (patch,) = [ln for ln in script.splitlines() if ln.startswith("kubectl patch deployment")]
        assert patch.startswith("kubectl patch deployment reports --namespace ml --type=merge -p ")
        assert f"# deployment/ml/reports: {MIG3}: 1 → {MIG1}: 1 (pods ml/{pod})" in script
        assert script.index("kubectl cordon gpu-a") < script.index(patch) < script.index("/eviction")
        rollout = "kubectl rollout status deployment/reports --namespace ml --timeout=60s"
        assert script.index("kubectl uncordon gpu-a") < script.index(rollout)
        # the script is exact: bash + kubectl against the same API server resize the workload
        done = subprocess.run(
            ["bash", "-c", script],
            env={**os.environ, "KUBECONFIG": str(kubeconfig)},
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert 'deployment "reports" successfully rolled out' in done.stdout
        assert template_limits(kube, "reports") == {MIG1: "1"}
        assert kube.annotations("gpu-a")[proto.ANN_STEP] == "done"
        (now,) = live_pods(kube)
        assert limits(now["spec"]) == {MIG1: "1"} and now["spec"]["nodeName"] == "gpu-a"


@pytest.mark.slow
def test_dry_run_says_when_a_node_would_be_refused(tmp_path, capsys):
    with KubeDouble() as kube:
        kube.add_node("gpu-a", gpus=1, mig_config="all-3g.40gb")
        kube.add_pod("notebook", namespace="ml", node="gpu-a", resources={MIG3: 1}, owner=None)
        plan_file = write_plan(
            resize_plan("gpu-a", "all-3g.40gb", {"1g.10gb": 7}, [("ml", "notebook", "1g.10gb")]),
            tmp_path / "plan.json",
        )
        kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig")
        argv = [
            "apply",
            "--plan",
            str(plan_file),
            "--kubeconfig",
            str(kubeconfig),
            "--repoint-cluster-policy",
        ]
        assert main([*argv, "--dry-run"]) == 0
        script = capsys.readouterr().out
        assert "# node gpu-a: refused, nothing would change: pod ml/notebook has no controller" in script
        assert "kubectl cordon gpu-a" not in script
