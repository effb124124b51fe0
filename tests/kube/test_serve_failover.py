"""Two ``rightsizer serve`` replicas on the real control plane, each with a token of the chart's
rightsizer ServiceAccount and its own plan from a real Prometheus: one leads through a real Lease
(coordination.k8s.io, the chart's RBAC), cordons a node and starts draining it; a PodDisruptionBudget
holds its evictions there (429 from the real Eviction API), and it is killed with SIGKILL. The other
replica takes the Lease over, finishes or rolls back what the dead one left in flight, and stays
within ``max_nodes_per_day``: every node settled and schedulable, every workload Running and Ready.

The fleet is the API double's failover test's (tests/support/rightsizer/takeover_support.py: node-a
of the small history cloned onto four nodes); its pods are real here, each of a Deployment of its
own asking for the devices the history shows, and the history is rewritten to their real names
before it is backfilled (a Deployment's pods cannot be named in advance)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from devkit.prometheus import PrometheusServer, backfill_openmetrics, free_port
from rightsizer.apply import protocol as proto
from rightsizer.clients.prometheus import PrometheusClient
from rightsizer.plan.pipeline import make_plan
from rightsizer.serve.leader import LEASE_NAME
from tests.kube import world
from tests.kube.conftest import REPO, RealCluster
from tests.support.rightsizer.small_history import write_history
from tests.support.rightsizer.takeover_support import NODES, PER_DAY, clone_node_a, serve_config

HELD = "failover-held"
"""The label every fleet workload carries: the PodDisruptionBudget that holds the leader selects it."""


def _history_text(work: Path) -> tuple[str, float]:
    now = time.time()
    end = now - now % 60  # a serve process plans at its own now: the inventory must be recent
    write_history(work / "one.om", end=end)
    return clone_node_a((work / "one.om").read_text(), NODES), end


def _plan_pods(text: str, work: Path, end: float) -> dict[str, list[dict[str, Any]]]:
    """node → the GPU pods a plan over ``text`` sees on it (name, devices)."""
    (work / "probe.om").write_text(text)
    backfill_openmetrics(work / "probe.om", work / "probe-data", block_duration="96h")
    with PrometheusServer(work / "probe-data", log_file=work / "probe.log") as server:
        job = serve_config(work / "probe-state", server.url).plan
        assert job is not None
        with PrometheusClient(server.url) as client:
            plan = make_plan(client, end=end, settings=job.plan_settings())
    assert sorted(n.name for n in plan.changed_nodes) == list(NODES)
    return {
        n.name: [
            {"name": p.name, "devices": [d.profile for d in p.devices]}
            for p in sorted((*n.pods_disrupted, *n.pods_kept), key=lambda p: p.name)
        ]
        for n in plan.nodes
    }


def _seed(cluster: RealCluster, namespace: str, pods: dict[str, list[dict[str, Any]]]) -> dict[str, str]:
    """The nodes and a Deployment per history pod; history name → the real pod's name."""
    for node in NODES:
        world.add_gpu_node(cluster, node, config="all-balanced", gpus=2)
    wanted: dict[str, str] = {}
    for i, (node, listed) in enumerate(sorted(pods.items())):
        for j, pod in enumerate(listed):
            name = f"w{i}-{j}"
            resources: dict[str, int] = {}
            for profile in pod["devices"]:
                key = f"nvidia.com/mig-{profile}" if profile else "nvidia.com/gpu"
                resources[key] = resources.get(key, 0) + 1
            world.deployment(cluster, namespace, name, resources=resources, node=node, labels={HELD: "yes"})
            wanted[name] = pod["name"]
    real: dict[str, str] = {}
    for name, history_name in wanted.items():
        (pod,) = world.wait(partial(world.running_pods, cluster, namespace, name), what=f"{name} Running")
        real[history_name] = pod["metadata"]["name"]
    return real


def _serve(config: dict[str, Any], name: str, work: Path) -> subprocess.Popen[bytes]:
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return subprocess.Popen(
        [sys.executable, "-m", "rightsizer", "serve", "--config", str(path)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "POD_NAME": name},
        stdout=(work / f"{name}.log").open("wb"),
        stderr=subprocess.STDOUT,
    )


def _node_steps(cluster: RealCluster) -> dict[str, proto.NodeView]:
    return {n: proto.view(cluster.kube.get("v1", "Node", n) or {}) for n in NODES}


def test_a_killed_leader_is_finished_by_the_other_replica_on_real_leases(
    real_cluster: RealCluster, chart: str, namespace: str
) -> None:
    work = Path(real_cluster.cp.directory) / namespace
    work.mkdir(parents=True, exist_ok=True)
    text, end = _history_text(work)
    pods = _plan_pods(text, work, end)
    real = _seed(real_cluster, namespace, pods)
    # the history as the cluster runs it: each pod under its real name, in the test's namespace
    names = re.compile(
        r'pod="(' + "|".join(re.escape(n) for n in sorted(real, key=len, reverse=True)) + r')"'
    )
    renamed = names.sub(lambda m: f'pod="{real[m.group(1)]}"', text).replace(
        'namespace="ml"', f'namespace="{namespace}"'
    )
    (work / "fleet.om").write_text(renamed)
    backfill_openmetrics(work / "fleet.om", work / "data", block_duration="96h")
    world.pdb(real_cluster, namespace, "hold", app="", min_available=10_000, selector={HELD: "yes"})
    procs: dict[str, subprocess.Popen[bytes]] = {}
    with PrometheusServer(work / "data", log_file=work / "prometheus.log") as server:
        try:
            for name in ("replica-a", "replica-b"):
                kubeconfig = world.service_account_kubeconfig(
                    real_cluster, work, chart, "gpupilot-rightsizer"
                )
                kubeconfig = kubeconfig.rename(work / f"{name}.kubeconfig")
                procs[name] = _serve(
                    {
                        "prometheus_url": server.url,
                        "timezone": "UTC",
                        "listen": f"127.0.0.1:{free_port()}",
                        "state_dir": str(work / name),
                        "plan": {"every": "6h", "window": "3d"},
                        "auto_apply": {
                            "enabled": True,
                            "maintenance_window": {"start": "00:00", "end": "23:59"},
                            "max_nodes_per_day": PER_DAY,
                            "check_every": "2s",
                            "kubeconfig": str(kubeconfig),
                            "repoint_cluster_policy": True,
                            "configmap_sync": "0s",
                            "lease_duration": "6s",
                            "leader_election": {"namespace": chart, "lease_duration": "8s"},
                        },
                    },
                    name,
                    work,
                )
            # the leader cordons a node, sets its workloads' requests and is held there by the
            # budget (its evictions answered 429)
            world.wait(
                lambda: any(v.step == "requests-set" for v in _node_steps(real_cluster).values()),
                what="the leader's first node held before its drain",
                timeout=120,
            )
            lease = real_cluster.kube.get("coordination.k8s.io/v1", "Lease", LEASE_NAME, chart)
            assert lease is not None
            holder = lease["spec"]["holderIdentity"]
            assert holder in procs, lease
            procs[holder].send_signal(signal.SIGKILL)
            assert procs[holder].wait(timeout=10) == -signal.SIGKILL
            in_flight = [n for n, v in _node_steps(real_cluster).items() if v.in_flight]
            assert in_flight, "killed with a node in flight"
            real_cluster.kube.delete("policy/v1", "PodDisruptionBudget", "hold", namespace)

            def settled() -> bool:
                views = _node_steps(real_cluster)
                return (
                    all(not v.in_flight and not v.unschedulable for v in views.values())
                    and sum(v.step == "done" for v in views.values()) == PER_DAY
                )

            world.wait(settled, what="the other replica settling the fleet", timeout=240)
            views = _node_steps(real_cluster)
            assert all(views[n].step == "done" for n in in_flight), {n: v.step for n, v in views.items()}
            cordoned = [n for n, v in views.items() if proto.cordoned_at(v) is not None]
            assert len(cordoned) <= PER_DAY, cordoned
            survivor = next(n for n in procs if n != holder)
            assert procs[survivor].poll() is None
            log = (work / f"{survivor}.log").read_text()
            assert "settling node(s) another run left in flight" in log
            lease = real_cluster.kube.get("coordination.k8s.io/v1", "Lease", LEASE_NAME, chart)
            assert lease is not None and lease["spec"]["holderIdentity"] == survivor
            for name in {f"w{i}-{j}" for i, listed in enumerate(pods.values()) for j in range(len(listed))}:
                world.wait(partial(world.running_pods, real_cluster, namespace, name), what=f"{name} Running")
        finally:
            for p in procs.values():
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
                    try:
                        p.wait(timeout=20)
                    except subprocess.TimeoutExpired:
                        p.kill()
                        p.wait()
