"""Two `serve` replicas on the API double: leader election through a Lease, the auto-apply ledger in a
ConfigMap; the leader dies mid-apply, the other takes over, resumes, and nothing runs twice."""

from __future__ import annotations

import dataclasses
import json
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from rightsizer.apply.applier import Applier
from rightsizer.clients.kube import Kube
from rightsizer.serve.config import parse
from rightsizer.serve.leader import LEASE_NAME, LeaderElector
from rightsizer.serve.ledger import CONFIGMAP, DATA_KEY, ConfigMapLedger
from rightsizer.serve.scheduler import Service
from tests.rightsizer.apply.test_apply import GOOD
from tests.support.kubedouble import KubeDouble
from tests.support.rightsizer.apply_support import FAST, Change, make_plan, seed_node

NOON = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


class Crash(Exception):
    """Stands in for the leader's process dying."""


DEPLOY = Path(__file__).resolve().parents[3] / "deploy"


class Jobs:
    def __init__(self, kube: KubeDouble, plan, *, token: str, die_after: str = "") -> None:  # type: ignore[no-untyped-def]
        self.kube, self.plan, self.die_after, self.token = kube, plan, die_after, token
        self.applied: list[list[str]] = []

    def make_plan(self, *, end, job):  # type: ignore[no-untyped-def]
        return self.plan

    def write_report(self, *, end, job, plan, out_dir):  # type: ignore[no-untyped-def]
        raise AssertionError("no report job configured")

    def apply(self, plan, *, settings):  # type: ignore[no-untyped-def]
        self.applied.append([n.name for n in plan.changed_nodes])

        def progress(node: str, message: str) -> None:
            if self.die_after and f"{node}: {message}".startswith(self.die_after):
                raise Crash(message)

        settings = dataclasses.replace(FAST, lease_duration_s=2)
        return Applier(Kube(self.kube.api_client(self.token)), plan, settings, progress=progress).run()


def replica(kube: KubeDouble, tmp_path, name: str, jobs: Jobs) -> tuple[Service, LeaderElector]:  # type: ignore[no-untyped-def]
    cfg = parse(
        {
            "prometheus_url": "http://prometheus:9090",
            "timezone": "UTC",
            "state_dir": str(tmp_path / name),
            "plan": {"every": "6h"},
            "auto_apply": {
                "enabled": True,
                "maintenance_window": {"start": "00:00", "end": "23:59"},
                "max_nodes_per_day": 5,
                "leader_election": {"namespace": "gpupilot", "lease_duration": "3s"},
            },
        },
        source="serve.yaml",
    )
    election = cfg.auto_apply.leader_election
    assert election is not None
    kube_client = Kube(kube.api_client(jobs.token))
    elector = LeaderElector(
        kube_client, election.namespace, identity=name, duration_s=election.lease_duration_s
    )
    service = Service(
        cfg,
        jobs=jobs,
        clock=lambda: NOON,
        ledger=ConfigMapLedger(kube_client, election.namespace),
        leader=elector.is_leader,
    )
    return service, elector


@pytest.mark.slow
def test_the_leader_dies_mid_apply_the_other_takes_over_and_nothing_runs_twice(tmp_path):
    with KubeDouble() as kube:
        seed_node(kube, "gpu-a")
        seed_node(kube, "gpu-b")
        plan = make_plan(
            [Change("gpu-a", "all-1g.10gb", GOOD, gpus_freed=2), Change("gpu-b", "all-1g.10gb", GOOD)]
        )
        kube.load_rbac(DEPLOY / "rightsizer")  # each replica has nothing but the rightsizer's RBAC
        token = kube.add_service_account("gpupilot", "gpupilot-rightsizer")
        jobs_a = Jobs(kube, plan, token=token, die_after="gpu-a: cordoned")
        jobs_b = Jobs(kube, plan, token=token)
        a, elect_a = replica(kube, tmp_path, "replica-a", jobs_a)
        b, elect_b = replica(kube, tmp_path, "replica-b", jobs_b)
        elect_a.start()
        kube.wait_for(elect_a.is_leader, timeout=5, what="replica-a leading")
        elect_b.start()
        for service in (a, b):
            service.run_plan()  # every replica plans
        b.run_auto_apply()
        assert jobs_b.applied == [] and b.state.runs[("auto_apply", "standby")] == 1

        a.run_auto_apply()  # dies after cordoning gpu-a
        assert jobs_a.applied == [["gpu-a", "gpu-b"]]
        ledger = json.loads(kube.configmap(CONFIGMAP, namespace="gpupilot")["data"][DATA_KEY])
        assert ledger[f"started:{plan.plan_id}"] == ["gpu-a", "gpu-b"]  # handed over before the apply
        elect_a.stop(release=False)  # the process is gone: its Lease is left to expire

        kube.wait_for(elect_b.is_leader, timeout=10, what="replica-b taking over")
        lease = kube.store.get("coordination.k8s.io/leases", "gpupilot", LEASE_NAME)
        assert lease is not None and lease["spec"]["holderIdentity"] == "replica-b"
        assert lease["spec"]["leaseTransitions"] == 1
        b.run_auto_apply()
        assert jobs_b.applied == [["gpu-a", "gpu-b"]]  # resumed, not restarted
        for node in ("gpu-a", "gpu-b"):
            assert kube.annotations(node)["gpupilot.io/step"] == "done"
            cordons = [
                x
                for x in kube.actions(verb="patch", name=node)
                if (x.detail["body"].get("spec") or {}).get("unschedulable")
            ]
            assert len(cordons) == 1, node  # the cordon was not repeated
        evicted = [x.name for x in kube.actions(verb="evict")]
        assert sorted(evicted) == sorted(set(evicted)) and len(evicted) == 4  # each GPU pod once
        ledger = json.loads(kube.configmap(CONFIGMAP, namespace="gpupilot")["data"][DATA_KEY])
        assert ledger["2026-11-30"] == ["gpu-a", "gpu-b"]
        assert ledger[f"plan:{plan.plan_id}"] == ["gpu-a", "gpu-b"]
        assert f"started:{plan.plan_id}" not in ledger
        b.run_auto_apply()  # a later round: nothing left to do, nothing runs again
        assert jobs_b.applied == [["gpu-a", "gpu-b"]]
        assert "already tried" in b.state.last_skip
        elect_b.stop()
        assert not elect_b.is_leader()


def test_two_electors_never_lead_at_once():
    with KubeDouble() as kube:
        electors = [
            LeaderElector(Kube(kube.api_client()), "gpupilot", identity=f"r{i}", duration_s=1.5)
            for i in range(3)
        ]
        for e in electors:
            e.start()
        kube.wait_for(lambda: any(e.is_leader() for e in electors), timeout=5)
        for _ in range(40):
            assert sum(e.is_leader() for e in electors) <= 1
            time.sleep(0.05)
        leader = next(e for e in electors if e.is_leader())
        leader.stop(release=True)  # a clean shutdown hands over at once
        kube.wait_for(lambda: any(e.is_leader() for e in electors if e is not leader), timeout=3)
        for e in electors:
            e.stop()
