"""Two `serve` replicas, each building its OWN plan from a real Prometheus, against the Kubernetes
API double (the official client over HTTP, the rightsizer's RBAC from deploy/): the leader dies at
every step of the apply protocol, both start at once, one's clock runs 120 s ahead, Lease updates
get 409, the leader loses its Lease mid-apply. Each run ends with every node done or rolled back,
at most max_nodes_per_day disrupted, no pod evicted twice and the ledger agreeing with the cluster.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devkit.prometheus import free_port
from rightsizer.apply import protocol as proto
from rightsizer.clients.kube import Kube
from rightsizer.clients.prometheus import PrometheusClient
from rightsizer.plan.pipeline import make_plan
from rightsizer.serve.leader import LEASE_NAME, LeaderElector
from rightsizer.serve.ledger import CONFIGMAP
from tests.support.kubedouble import KubeDouble, MigManagerSettings
from tests.support.rightsizer.takeover_support import (
    NAMESPACE,
    NODES,
    PER_DAY,
    STEPS,
    History,
    Killed,
    Replica,
    assert_settled,
    fleet_history,
    ledger,
    seed_cluster,
    serve_config,
)

REPO = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.prometheus  # every replica plans from a real Prometheus


@pytest.fixture(scope="module")
def takeover_history(tmp_path_factory: pytest.TempPathFactory) -> Iterator[History]:
    yield from fleet_history(tmp_path_factory.mktemp("takeover-history"))


@pytest.fixture(scope="module")
def pods(
    takeover_history: History, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, list[dict[str, Any]]]:
    """node → the GPU pods the history shows on it now (what the cluster runs): plan-shaped
    ``name`` and ``devices`` (GPU index and MIG profile)."""
    job = serve_config(tmp_path_factory.mktemp("plan"), takeover_history.url).plan
    assert job is not None
    with PrometheusClient(takeover_history.url) as client:
        plan = make_plan(client, end=takeover_history.end, settings=job.plan_settings())
    assert sorted(n.name for n in plan.changed_nodes) == list(NODES)
    return {
        n.name: [
            {"name": p.name, "devices": [{"gpu": d.gpu, "profile": d.profile} for d in p.devices]}
            for p in sorted((*n.pods_disrupted, *n.pods_kept), key=lambda p: p.name)
        ]
        for n in plan.nodes
    }


def replicas(
    kube: KubeDouble, takeover_history: History, tmp_path: Path, **b_options: float
) -> tuple[Replica, Replica]:
    """Two replicas, each its own token (the same service account) and its own plan's end."""
    token_a = kube.add_service_account(NAMESPACE, "gpupilot-rightsizer")
    token_b = kube.add_service_account(NAMESPACE, "gpupilot-rightsizer")
    a = Replica(
        kube, takeover_history, "replica-a", tmp_path / "a", plan_end=takeover_history.end, token=token_a
    )
    b = Replica(
        kube,
        takeover_history,
        "replica-b",
        tmp_path / "b",
        plan_end=takeover_history.end - 900,
        token=token_b,
        **b_options,
    )
    return a, b


def lead(replica: Replica, kube: KubeDouble, timeout: float = 25) -> None:
    kube.wait_for(replica.elector.is_leader, timeout=timeout, what=f"{replica.name} leading")


@pytest.mark.slow
@pytest.mark.parametrize("step", list(STEPS))
def test_a_leader_killed_at_any_step_is_finished_by_the_other_within_the_budget(
    step: str, takeover_history: History, pods: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    with KubeDouble(mig_manager=MigManagerSettings(pending_s=0.05)) as kube:
        seed_cluster(kube, pods)
        a, b = replicas(kube, takeover_history, tmp_path)
        a.start()
        lead(a, kube)
        b.start()
        for r in (a, b):
            assert r.service.run_plan()
        assert a.plans[0] != b.plans[0]  # each replica its own plan, not a shared object
        assert b.service.run_auto_apply() and b.service.state.runs[("auto_apply", "standby")] == 1
        a.crash_at = step
        with pytest.raises(Killed):
            a.service.run_auto_apply()
        assert a.applied == [["gpu-1", "gpu-2"]]
        assert sorted(ledger(kube)[f"started:{a.plans[0]}"]) == ["gpu-1", "gpu-2"]  # handed over first
        a.stop()  # the process is gone: its Leases are left to expire
        b.skip(a.elector.duration_s)  # b has seen a's Lease unchanged for its whole duration

        lead(b, kube)
        assert b.service.run_auto_apply()
        steps = assert_settled(kube)
        assert steps["gpu-1"] == "done", steps  # the dead leader's node finished: the plans agree on it
        assert sum(s == "done" for s in steps.values()) == PER_DAY
        writes = len(kube.actions(resource="configmaps", name=CONFIGMAP))
        b.service.run_auto_apply()  # a later round: the day's budget is spent, nothing more starts
        assert "max_nodes_per_day=2 reached" in b.service.state.last_skip
        assert (
            len(kube.actions(resource="configmaps", name=CONFIGMAP)) == writes
        )  # nor is the ledger rewritten
        assert_settled(kube)
        b.stop()


def test_simultaneous_start_one_applies_within_the_budget(
    takeover_history: History, pods: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    with KubeDouble() as kube:
        seed_cluster(kube, pods)
        a, b = replicas(kube, takeover_history, tmp_path)
        both = [threading.Thread(target=r.start) for r in (a, b)]
        for t in both:
            t.start()
        for t in both:
            t.join()
        kube.wait_for(lambda: a.elector.is_leader() or b.elector.is_leader(), timeout=20, what="a leader")
        for r in (a, b):
            r.service.run_plan()

        def two_rounds(r: Replica) -> None:  # one at a time per replica, as APScheduler runs them
            for _ in range(2):
                r.service.run_auto_apply()

        rounds = [threading.Thread(target=two_rounds, args=(r,)) for r in (a, b)]
        for t in rounds:
            t.start()
        for t in rounds:
            t.join()
        assert not (a.applied and b.applied), (a.applied, b.applied)
        assert (a.applied or b.applied)[0] == ["gpu-1", "gpu-2"]
        steps = assert_settled(kube)
        assert sorted(n for n, s in steps.items() if s == "done") == ["gpu-1", "gpu-2"]
        a.stop()
        b.stop()


def test_a_replica_whose_clock_runs_120s_ahead_does_not_take_a_live_lease(
    takeover_history: History, pods: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    with KubeDouble() as kube:
        seed_cluster(kube, pods)
        a, b = replicas(kube, takeover_history, tmp_path, wall_offset_s=120.0)
        a.start()
        lead(a, kube)
        b.start()
        # judged by renewTime (120 s in b's past), b would take the Lease on its first round; judged
        # by observation it waits a Lease duration of no change, which a's renewals never allow
        rounds = b.kube.lease_reads[LEASE_NAME] + 20
        while b.kube.lease_reads[LEASE_NAME] < rounds:
            assert a.elector.is_leader() and not b.elector.is_leader()
            time.sleep(0.02)
        a.stop()  # a clean stop hands over at once, whatever the clocks say
        lead(b, kube, timeout=25)
        b.stop()


def test_409_on_lease_updates_neither_splits_leadership_nor_stops_the_apply(
    takeover_history: History, pods: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    with KubeDouble(mig_manager=MigManagerSettings(pending_s=0.4)) as kube:
        seed_cluster(kube, pods)
        a, b = replicas(kube, takeover_history, tmp_path)
        a.start()
        lead(a, kube)
        b.start()
        a.service.run_plan()
        seen: list[bool] = []
        watching = threading.Event()

        def watch() -> None:
            while not watching.is_set():
                seen.append(a.elector.is_leader() and b.elector.is_leader())
                time.sleep(0.02)

        watcher = threading.Thread(target=watch)
        watcher.start()
        # a 409 on a renewal (someone wrote first) is answered by re-reading; the leader keeps leading
        # (conflicts for longer than its renew deadline would make it step down: client-go's rule)
        kube.inject_conflicts("leases", LEASE_NAME, 1)
        kube.inject_conflicts("leases", "gpupilot-rightsizer-apply", 2)  # the apply Lease's renewals
        assert a.service.run_auto_apply()
        watching.set()
        watcher.join()
        assert not any(seen)  # never two leaders
        puts = [f for f in kube.api.faults if f.status == 409 and f.method == "PUT"]
        assert [(f.path_contains, f.count) for f in puts] == [
            (f"/leases/{LEASE_NAME}", 0),
            ("/leases/gpupilot-rightsizer-apply", 0),
        ]  # every injected 409 was answered to a renewal
        assert all(f.hits > 1 for f in puts)  # and renewals went on after them
        assert a.elector.is_leader()
        steps = assert_settled(kube)
        assert sorted(n for n, s in steps.items() if s == "done") == ["gpu-1", "gpu-2"]
        a.stop()
        b.stop()


def test_a_leader_that_loses_leadership_mid_apply_stops_at_a_safe_step_and_the_other_resumes(
    takeover_history: History, pods: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    with KubeDouble() as kube:
        seed_cluster(kube, pods)
        a, b = replicas(kube, takeover_history, tmp_path)
        a.start()
        lead(a, kube)
        b.start()
        for r in (a, b):
            r.service.run_plan()

        def lose(node: str, message: str) -> None:
            if message == "cordoned" and a.elector.is_leader():
                a.elector.stop(release=False)  # its renewals stop: leadership ends here

        a.on_step = lose
        assert a.service.run_auto_apply()  # the round ends early, handing over; nothing failed
        results = {n: r for n, r in a.service.state.applies.items() if r}
        assert results == {"stopped": 1, "not-started": 1}, results
        assert kube.annotations("gpu-1")["gpupilot.io/step"] == "cordoned"  # a recorded step
        assert not kube.actions(verb="evict")  # never inside an eviction batch
        b.skip(a.elector.duration_s)  # a's last renewal is a Lease duration old
        lead(b, kube)
        assert b.service.run_auto_apply()
        steps = assert_settled(kube)
        assert sorted(n for n, s in steps.items() if s == "done") == ["gpu-1", "gpu-2"]
        b.stop()


def test_two_electors_never_lead_at_once() -> None:
    with KubeDouble() as kube:
        electors = [
            LeaderElector(Kube(kube.api_client()), "gpupilot", identity=f"r{i}", duration_s=3.0)
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
        kube.wait_for(lambda: any(e.is_leader() for e in electors if e is not leader), timeout=8)
        for e in electors:
            e.stop()


def _serve_process(config: Path, identity: str, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "rightsizer", "serve", "--config", str(config)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "POD_NAME": identity},
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )


@pytest.mark.slow
def test_sigkill_of_the_leading_serve_process_after_its_cordon(
    takeover_history: History, pods: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    """Two real `serve` processes (each its own kubeconfig, Lease elector and plan from Prometheus);
    the leader gets SIGKILL right after it cordoned a node; the other finishes that node and stays
    within the day's budget.

    The leader is held after its first cordon: the Eviction API answers 503 until the kill, so the
    leader retries its drain. (Waiting for a node at step ``cordoned`` alone raced: that step lasts
    the few milliseconds between the cordon and the template patches, a poll on a loaded machine
    missed it, and the test either waited for ever or killed the leader after it had finished a node
    it never got to record.)"""
    with KubeDouble() as kube:
        seed_cluster(kube, pods)
        held = kube.inject_fault(503, method="POST", path_contains="/eviction", count=None)
        procs: dict[str, subprocess.Popen[bytes]] = {}
        for name in ("replica-a", "replica-b"):
            token = kube.add_service_account(NAMESPACE, "gpupilot-rightsizer")
            doc = {
                "prometheus_url": takeover_history.url,
                "timezone": "UTC",
                "listen": f"127.0.0.1:{free_port()}",
                "state_dir": str(tmp_path / name),
                "plan": {"every": "6h", "window": "3d"},
                "auto_apply": {
                    "enabled": True,
                    "maintenance_window": {"start": "00:00", "end": "23:59"},
                    "max_nodes_per_day": PER_DAY,
                    "check_every": "1s",
                    "kubeconfig": str(kube.write_kubeconfig(tmp_path / f"{name}.kubeconfig", token=token)),
                    "repoint_cluster_policy": True,
                    "configmap_sync": "0s",
                    "lease_duration": "4s",
                    # long enough that no renewal is missed on a loaded machine; the survivor
                    # takes over this long after the SIGKILL
                    "leader_election": {"namespace": NAMESPACE, "lease_duration": "6s"},
                },
            }
            config = tmp_path / f"{name}.yaml"
            config.write_text(yaml.safe_dump(doc))
            procs[name] = _serve_process(config, name, tmp_path / f"{name}.log")
        try:
            kube.wait_for(lambda: held.hits > 0, timeout=60, what="the leader's first drain after its cordon")
            lease = kube.store.get("coordination.k8s.io/leases", NAMESPACE, LEASE_NAME)
            assert lease is not None
            holder = lease["spec"]["holderIdentity"]
            procs[holder].send_signal(signal.SIGKILL)
            assert procs[holder].wait(timeout=10) == -signal.SIGKILL
            kube.clear_faults()
            in_flight = [n for n in NODES if proto.view(kube.node(n)).in_flight]
            assert len(in_flight) == 1  # killed with its first node in flight, after the cordon
            assert kube.annotations(in_flight[0])["gpupilot.io/step"] in ("cordoned", "requests-set")

            def settled() -> bool:
                try:
                    steps = assert_settled(kube)
                except AssertionError:
                    return False
                return sum(s == "done" for s in steps.values()) == PER_DAY

            kube.wait_for(settled, timeout=60, what="the other replica settling the fleet")
            steps = assert_settled(kube)
            assert all(steps[n] == "done" for n in in_flight)  # finished by the survivor
            survivor = next(p for n, p in procs.items() if n != holder)
            assert survivor.poll() is None
            survivor.send_signal(signal.SIGTERM)
            assert survivor.wait(timeout=20) == 0
            log = (tmp_path / f"{next(n for n in procs if n != holder)}.log").read_text()
            assert "settling node(s) another run left in flight" in log
        finally:
            for p in procs.values():
                if p.poll() is None:
                    p.kill()
                    p.wait()
