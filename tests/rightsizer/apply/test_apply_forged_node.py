"""A node's own annotations cannot steer apply: the forged-annotation attack (a node not in the plan
"left in flight" naming a workload on another node) and its forward variant (a node the plan changes
"resumed" with forged workload moves), played through the API with the rightsizer's RBAC and
admission policies, leave the victim and the attacking node as they were while the plan's own change
goes through; the in-flight record, not the node, says what apply changed, and a template is
restored only when its own mark agrees with the record."""

from __future__ import annotations

import kubernetes
import pytest

from rightsizer.apply import protocol as proto
from rightsizer.apply import record as inflight
from rightsizer.apply import workloads as wl
from rightsizer.apply.applier import Applier
from rightsizer.clients.kube import Kube
from rightsizer.plan.model import Plan
from tests.rightsizer.apply.test_apply_admission import MIG1, MIG3, SETTINGS, guarded, template_limits
from tests.support.kubedouble import KubeDouble
from tests.support.rightsizer import forged_node as attack
from tests.support.rightsizer.apply_support import resize_plan

NODE_TOKEN = "kubelet-gpu-b"
UNTOUCHED = {f"{part}/{attack.GPU}": "1" for part in ("limits", "requests")}


def cluster(kube: KubeDouble) -> tuple[attack.Target, str]:
    """gpu-a in the plan (one pod of ml/reports), gpu-b the attacker (in no plan), the victim on gpu-c;
    the rightsizer under its RBAC and policies, gpu-b's kubelet allowed its own Node. Returns the
    target and the name of the reports pod."""
    token = guarded(kube)
    kube.add_node("gpu-a", gpus=1, mig_config="all-3g.40gb")
    kube.add_workload("Deployment", "reports", namespace="ml", replicas=1, resources={MIG3: 1}, node="gpu-a")
    kube.add_node("gpu-b", gpus=1, mig_config="all-3g.40gb")
    kube.add_node("gpu-c", gpus=1, mig_config=None)
    kube.add_workload(
        "Deployment",
        attack.VICTIM,
        namespace=attack.VICTIM_NAMESPACE,
        resources={attack.GPU: 1},
        node="gpu-c",
    )
    kube.add_token(NODE_TOKEN, "system:node:gpu-b", ["system:nodes", "system:authenticated"])
    for verb in ("get", "patch"):
        kube.allow("system:node:gpu-b", verb, "nodes", name="gpu-b")
    (pod,) = [str(p["metadata"]["name"]) for p in kube.pods(node="gpu-a")]
    target = attack.Target(
        rightsizer=kube.api_client(token), node=kube.api_client(NODE_TOKEN), admin=kube.api_client()
    )
    return target, pod


def run(target: attack.Target, plan: Plan) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    lines: list[tuple[str, str]] = []
    report = Applier(
        Kube(target.rightsizer), plan, SETTINGS, progress=lambda n, m: lines.append((n, m))
    ).run()
    return [(o.node, o.result) for o in report.outcomes], lines


@pytest.mark.slow
def test_forged_in_flight_annotations_on_a_node_outside_the_plan_are_set_aside() -> None:
    with KubeDouble() as kube:
        target, pod = cluster(kube)
        assert attack.node_may_write_record(target, SETTINGS.namespace) == 403
        forged = attack.rollback_attack(target, "gpu-b", previous="all-1g.10gb", config="all-3g.40gb")
        before = attack.node_state(target, "gpu-b")
        plan = resize_plan("gpu-a", "all-3g.40gb", {"1g.10gb": 7}, [("ml", pod, "1g.10gb")])
        outcomes, lines = run(target, plan)
        assert outcomes == [("gpu-a", "applied")]  # gpu-b is not "rolled back"
        assert attack.victim_requests(target) == UNTOUCHED
        assert wl.ANN_CHANGED_BY not in (attack.victim(target)["metadata"].get("annotations") or {})
        assert attack.node_state(target, "gpu-b") == before  # nothing written on the attacker either
        assert before["annotations"][proto.ANN_STEP] == forged[proto.ANN_STEP]
        assert any(n == "gpu-b" and "set aside" in m for n, m in lines), lines
        assert template_limits(kube) == {MIG1: "1"}  # the plan's own move went through
        assert not [a for a in kube.actions(resource="deployments") if a.namespace == attack.VICTIM_NAMESPACE]


@pytest.mark.slow
def test_forged_workload_moves_on_a_node_the_plan_changes_are_never_resumed() -> None:
    with KubeDouble() as kube:
        target, pod = cluster(kube)
        plan = resize_plan("gpu-a", "all-3g.40gb", {"1g.10gb": 7}, [("ml", pod, "1g.10gb")])
        (pn,) = plan.changed_nodes
        kube.add_token("kubelet-gpu-a", "system:node:gpu-a", ["system:nodes", "system:authenticated"])
        for verb in ("get", "patch"):
            kube.allow("system:node:gpu-a", verb, "nodes", name="gpu-a")
        attack.forward_attack(
            attack.Target(target.rightsizer, kube.api_client("kubelet-gpu-a"), target.admin),
            "gpu-a",
            plan_id=plan.plan_id,
            previous=pn.current_config_name,
            config=pn.config_name,
        )
        outcomes, lines = run(target, plan)
        assert outcomes == [("gpu-a", "applied")]
        assert attack.victim_requests(target) == UNTOUCHED
        assert not [a for a in kube.actions(resource="deployments") if a.namespace == attack.VICTIM_NAMESPACE]
        assert template_limits(kube) == {MIG1: "1"}
        # the node shows what this run recorded, not what was forged
        shown = wl.decode(kube.annotations("gpu-a")[wl.ANN_WORKLOADS])
        assert [c.ref for c in shown] == ["deployment/ml/reports"]
        assert not any("resuming" in m for _, m in lines), lines


class Killed(BaseException):
    """The first run's process dies here."""


@pytest.mark.slow
def test_a_rollback_restores_only_templates_whose_mark_agrees_with_the_record() -> None:
    with KubeDouble() as kube:
        target, pod = cluster(kube)
        plan = resize_plan("gpu-a", "all-3g.40gb", {"1g.10gb": 7}, [("ml", pod, "1g.10gb")])

        def die(node: str, message: str) -> None:
            if message.startswith("patched deployment/ml/reports"):
                raise Killed

        with pytest.raises(Killed):
            Applier(Kube(target.rightsizer), plan, SETTINGS, progress=die).run()
        held = inflight.InFlightRecord(Kube(target.admin), SETTINGS.namespace).load()
        assert [c.ref for c in held["gpu-a"].changes] == ["deployment/ml/reports"]
        assert template_limits(kube) == {MIG1: "1"}
        # someone else takes the workload over (their own mark) before the rollback
        kubernetes.client.AppsV1Api(target.admin).patch_namespaced_deployment(
            "reports", "ml", {"metadata": {"annotations": {wl.ANN_CHANGED_BY: "their-plan"}}}
        )
        other = resize_plan("gpu-b", "all-3g.40gb", {"1g.10gb": 7}, [])
        outcomes, lines = run(target, other)
        assert ("gpu-a", "orphan-rolled-back") in outcomes
        assert template_limits(kube) == {MIG1: "1"}  # theirs now: left as it is
        assert any("left as it is" in m and "their-plan" in m for _, m in lines), lines
        assert inflight.InFlightRecord(Kube(target.admin), SETTINGS.namespace).load().keys() <= {"gpu-b"}
        assert kube.annotations("gpu-a")[proto.ANN_STEP] == "rolled-back"
