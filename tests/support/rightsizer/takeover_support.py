"""Two `serve` replicas against the Kubernetes API double and a real Prometheus, each building its
own plan: the fleet's history, the replica harness (its own token, Lease elector, ledger ConfigMap,
and a crash that can be injected at a named step of the apply protocol), and the end-state checks.

The history is :mod:`tests.support.rightsizer.small_history`'s ``node-a`` (two H100s whose MIG layout the
plan changes, four GPU pods) cloned onto four nodes, so every plan changes four nodes the same way.
"""

from __future__ import annotations

import dataclasses
import json
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from devkit.prometheus import PrometheusServer, backfill_openmetrics
from rightsizer.apply import protocol as proto
from rightsizer.apply.applier import Applier
from rightsizer.apply.record import mig_nodes
from rightsizer.clients.kube import Kube, PermanentKubeError
from rightsizer.clients.prometheus import PrometheusClient
from rightsizer.commands.serve import apply_settings
from rightsizer.plan.pipeline import make_plan
from rightsizer.serve.config import ServeConfig, parse
from rightsizer.serve.leader import LEASE_NAME, LeaderElector
from rightsizer.serve.ledger import CONFIGMAP, DATA_KEY, ConfigMapLedger
from rightsizer.serve.scheduler import Service
from tests.support.kubedouble import KubeDouble, fromplan
from tests.support.rightsizer.small_history import DAYS, write_history

NODES = ("gpu-1", "gpu-2", "gpu-3", "gpu-4")
PER_DAY = 2
NAMESPACE = "gpupilot"
LEADER_LEASE_S = 10.0
"""Long enough that no leader on a loaded 2-core machine misses its renew deadline (6.7 s); a test
that needs the Lease of a dead replica to expire moves the survivor's clock (:meth:`Replica.skip`)."""
RETRY_S = 0.2
DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
_NODE_A_PODS = ("infer-a-5d8f7c9b6-abcde", "infer-a-5d8f7c9b6-fghij", "train-0", "batch-1", "old-job")


def clone_node_a(text: str, names: tuple[str, ...]) -> str:
    """Keep the comments and node-a's lines, each once per name in ``names`` (node, GPU, MIG and
    pod identities renamed, so the series stay distinct)."""
    pods = "|".join(re.escape(p) for p in _NODE_A_PODS)
    mine = re.compile(rf'"node-a"|GPU-node-a-|pod="({pods})"')
    out: list[str] = []
    for line in text.splitlines():
        if line.startswith("#"):
            out.append(line)
            continue
        if not mine.search(line):
            continue
        for i, name in enumerate(names):
            cloned = line.replace('"node-a"', f'"{name}"').replace("GPU-node-a-", f"GPU-{name}-")
            cloned = cloned.replace('mig_uuid="MIG-a', f'mig_uuid="MIG-{i}a')
            cloned = re.sub(rf'pod="({pods})"', rf'pod="\1-{name}"', cloned)
            out.append(cloned)
    return "\n".join(out) + "\n"


@dataclass(frozen=True)
class History:
    url: str
    end: float


def fleet_history(base: Path) -> Iterator[History]:
    """A real Prometheus over three days of the cloned fleet (a few seconds to build)."""
    now = time.time()
    end = now - now % 60  # a `serve` process plans at its own now: the inventory must be recent
    write_history(base / "one.om", end=end)
    (base / "fleet.om").write_text(clone_node_a((base / "one.om").read_text(), NODES))
    backfill_openmetrics(base / "fleet.om", base / "data", block_duration="96h")
    with PrometheusServer(base / "data", log_file=base / "prometheus.log") as server:
        yield History(server.url, end)


def seed_cluster(kube: KubeDouble, plan_nodes: dict[str, list[dict[str, Any]]]) -> None:
    """The four nodes as the history shows them (config all-balanced), each with its GPU pods (each
    from a Deployment of its own asking for the devices it holds, so apply can change its request)
    and a CPU pod; the rightsizer's RBAC from deploy/."""
    for name in NODES:
        kube.add_node(name, gpus=2, mig_config="all-balanced")
        for pod in plan_nodes[name]:
            profiles = [d["profile"] for d in pod["devices"]] or [""]
            requests = {
                (f"nvidia.com/mig-{p}" if p else "nvidia.com/gpu"): str(profiles.count(p)) for p in profiles
            }
            fromplan.add_deployment(
                kube, namespace="ml", name=pod["name"], node=name, requests=requests, pods=[pod]
            )
        kube.add_pod(f"cpu-{name}", namespace="ml", node=name, resources={"cpu": 1})
    kube.load_rbac(DEPLOY / "rightsizer")


def serve_config(state_dir: Path, url: str) -> ServeConfig:
    return parse(
        {
            "prometheus_url": url,
            "timezone": "UTC",
            "state_dir": str(state_dir),
            "plan": {"every": "6h", "window": f"{DAYS}d"},
            "auto_apply": {
                "enabled": True,
                "maintenance_window": {"start": "00:00", "end": "23:59"},
                "max_nodes_per_day": PER_DAY,
                "min_gpus_freed": 1,
                "repoint_cluster_policy": True,  # the GPU Operator as installed by default
                "configmap_sync": "0s",
                "lease_duration": "4s",
                "leader_election": {"namespace": NAMESPACE, "lease_duration": "3s"},
            },
        },
        source="serve.yaml",
    )


class Killed(BaseException):
    """The replica's process died here (not an error the code could catch and handle)."""


class Mortal:
    """A replica's door to the API: once its process is dead, nothing more reaches the cluster."""

    def __init__(self, kube: Kube, dead: threading.Event) -> None:
        self._kube, self._dead = kube, dead
        self.lease_reads: Counter[str] = Counter()
        """Lease name → reads that returned (the elector's rounds, for :meth:`Replica.skip`)."""

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._kube, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            if self._dead.is_set():
                raise PermanentKubeError(f"{name}: the replica's process is dead")
            answer = attr(*args, **kwargs)
            if name == "get_lease":
                self.lease_reads[args[1]] += 1
            return answer

        return call


STEPS = {
    "before-cordon": "",  # the hand-over is in the ledger, no node touched yet
    "after-cordon": "cordoned",
    "between-evictions": "evicted ",
    "after-relabel": "relabelled ",
    "mig-manager-pending": f"{proto.STATE_LABEL}=pending",
    "after-success-before-uncordon": f"{proto.STATE_LABEL}=success",
}


class Replica:
    def __init__(
        self,
        kube: KubeDouble,
        history: History,
        name: str,
        state_dir: Path,
        *,
        plan_end: float,
        wall_offset_s: float = 0.0,
        token: str,
    ) -> None:
        self.name, self.history, self.plan_end = name, history, plan_end
        self.dead = threading.Event()
        self._skipped_s = 0.0
        self.kube = Mortal(Kube(kube.api_client(token)), self.dead)
        self.config = serve_config(state_dir, history.url)
        election = self.config.auto_apply.leader_election
        assert election is not None
        self.elector = LeaderElector(
            self.kube,  # type: ignore[arg-type]
            election.namespace,
            identity=name,
            duration_s=LEADER_LEASE_S,
            wall=lambda: datetime.now(UTC) + timedelta(seconds=wall_offset_s),
            monotonic=lambda: time.monotonic() + self._skipped_s,
            retry_s=RETRY_S,
        )
        self.crash_at = ""
        self.on_step: Callable[[str, str], None] | None = None
        self.applied: list[list[str]] = []
        self.plans: list[str] = []
        self.service = Service(
            self.config,
            jobs=self,
            ledger=ConfigMapLedger(self.kube, election.namespace),  # type: ignore[arg-type]
            leader=self.elector.is_leader,
        )

    # -- the Jobs protocol ----------------------------------------------------------------------
    def make_plan(self, *, end: float, job: Any) -> Any:
        with PrometheusClient(self.history.url) as client:
            plan = make_plan(client, end=self.plan_end, settings=job.plan_settings())
        self.plans.append(plan.plan_id)
        return plan

    def write_report(self, **_: Any) -> Path:
        raise AssertionError("no report job configured")

    def node_marks(self, *, settings: Any) -> list[proto.NodeView]:
        return mig_nodes(self.kube, apply_settings(settings).namespace)  # type: ignore[arg-type]

    def apply(self, plan: Any, *, settings: Any, nodes: Any, stop: Any) -> Any:
        self.applied.append(list(nodes))
        if self.crash_at == "before-cordon":
            self.kill()
        fast = dataclasses.replace(
            apply_settings(settings),
            retry_interval_s=0.02,
            timeout_s=20,
            eviction_timeout_s=10,
            api_retry_s=5,
        )
        return Applier(self.kube, plan, fast, only=nodes, stop=stop, progress=self._progress).run()  # type: ignore[arg-type]

    def _progress(self, node: str, message: str) -> None:
        if self.on_step is not None:
            self.on_step(node, message)
        prefix = STEPS.get(self.crash_at)
        if prefix and node != "-" and message.startswith(prefix) and not self.dead.is_set():
            self.kill()

    def kill(self) -> None:
        """SIGKILL, in effect: no more API calls, no Lease renewals, no release."""
        self.dead.set()
        raise Killed(self.name)

    def skip(self, seconds: float) -> None:
        """Let ``seconds`` pass on this replica's elector clock at once (a dead holder's Lease
        expires as it would after that wait, judged by the same observation rule) — once its elector
        has read the Lease as it is now: a round that started before the call may have read the
        holder's previous record, and the last change is timed from when it is seen."""
        seen = self.kube.lease_reads[LEASE_NAME]
        deadline = time.monotonic() + 30
        while self.kube.lease_reads[LEASE_NAME] < seen + 2:
            assert time.monotonic() < deadline, f"{self.name}'s elector read no Lease for 30 s"
            time.sleep(0.01)
        self._skipped_s += seconds

    def start(self) -> Replica:
        self.elector.start()
        return self

    def stop(self) -> None:
        self.elector.stop(release=not self.dead.is_set())


def ledger(kube: KubeDouble) -> dict[str, list[str]]:
    cm = kube.configmap(CONFIGMAP, namespace=NAMESPACE)
    return {} if cm is None else json.loads(cm["data"][DATA_KEY])


def assert_settled(kube: KubeDouble) -> dict[str, str]:
    """Every node done or rolled back and schedulable, at most PER_DAY disrupted today, no pod
    evicted twice, no node cordoned twice, and the ledger agreeing with the cluster; returns
    node → step."""
    steps: dict[str, str] = {}
    cordoned: set[str] = set()
    for name in NODES:
        node = proto.view(kube.node(name))
        assert not node.in_flight, f"{name} left at step {node.step}"
        assert not node.unschedulable, f"{name} left cordoned"
        steps[name] = node.step
        if proto.cordoned_at(node) is not None:
            cordoned.add(name)
        cordons = [
            a
            for a in kube.actions(verb="patch", name=name)
            if ((a.detail.get("body") or {}).get("spec") or {}).get("unschedulable")
        ]
        assert len(cordons) <= 1, f"{name} cordoned {len(cordons)} times"
    assert len(cordoned) <= PER_DAY, f"{sorted(cordoned)} disrupted against max_nodes_per_day={PER_DAY}"
    evicted = [(a.namespace, a.name) for a in kube.actions(verb="evict")]
    assert len(evicted) == len(set(evicted)), f"a pod was evicted twice: {evicted}"
    entries = ledger(kube)
    today = datetime.now(UTC).date().isoformat()
    assert set(entries.get(today, [])) == cordoned, (entries, cordoned)
    assert not [k for k in entries if k.startswith("started:")], entries
    return steps
