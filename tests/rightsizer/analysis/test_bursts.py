"""Daily bursts against a real Prometheus: plans at every hour of a day (``--at``) over windows of
1, 2 and 7 days never size a burst below what its peak needs, never change an already optimal node,
and say exactly which pods ``apply`` evicts (checked against the Kubernetes API double).

Each plan is checked by an independent reading of the fleet in :mod:`tests.support.rightsizer.burst_history`
(burst levels and profile sizes, not the code's numbers).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Iterator

import pytest
import yaml

from devkit.prometheus import PrometheusServer, backfill_openmetrics
from rightsizer.apply import dryrun
from rightsizer.apply.applier import Applier
from rightsizer.clients.kube import Kube
from rightsizer.clients.prometheus import PrometheusClient
from rightsizer.optimise.proposal import OptimiserSettings
from rightsizer.plan.model import NodePlan, Plan
from rightsizer.plan.pipeline import make_plan
from rightsizer.plan.settings import PlanSettings
from tests.support.kubedouble import KubeDouble, fromplan
from tests.support.rightsizer.apply_support import FAST
from tests.support.rightsizer.burst_history import BURSTS, JOBS, NAMESPACE, Job, write_history
from tests.support.rightsizer.history import History

pytestmark = pytest.mark.prometheus

WINDOWS = {"1d": 86400.0, "2d": 2 * 86400.0, "7d": 7 * 86400.0}


@pytest.fixture(scope="module")
def burst_history(tmp_path_factory: pytest.TempPathFactory) -> Iterator[History]:
    base = tmp_path_factory.mktemp("bursts")
    now = time.time()
    end = now - now % 3600 - 3600
    start = write_history(base / "history.om", end=end)
    backfill_openmetrics(base / "history.om", base / "data", block_duration="96h")
    with PrometheusServer(base / "data", log_file=base / "prometheus.log") as server:
        yield History(server.url, start, end)


def _slices(profile: str) -> int:
    return int(profile.split("g.", maxsplit=1)[0])


def sweep_times(end: float, *, every_h: int = 1, first_h: int = 0) -> list[float]:
    """Every ``every_h`` hours of the last day from ``first_h``, every other one 17 minutes past (cuts
    inside a burst)."""
    return [end - 86400 + k * 3600 + (k // every_h % 2) * 1020 for k in range(first_h, 24, every_h)]


SWEEPS = {"1d": {"every_h": 1}, "2d": {"every_h": 2, "first_h": 1}, "7d": {"every_h": 4, "first_h": 3}}
"""Where a window's cut can split a burst: a day's window holds each daily burst once, so a cut inside
one leaves a part at each end, and every hour (half of them 17 minutes past) is planned. Longer windows
hold at least one whole burst besides any they cut, so fewer hours suffice; their hours still include
cuts inside bursts (2 days: 03:17 inside the 1 h burst, 15:17 inside the 3 h one and 23:17 inside both
of those straddling midnight; 7 days: 15:17 and 23:17), each a plan over 2 or 7 daily chunks."""


def plan_at(client: PrometheusClient, at: float, window_s: float) -> Plan:
    return make_plan(
        client, end=at, settings=PlanSettings(window_s=window_s, optimiser=OptimiserSettings(time_limit_s=5))
    )


def profile_after(node: NodePlan, job: Job) -> str:
    """The profile ``job``'s pod holds once the plan is applied: its target if evicted, else its own."""
    for p in node.pods_disrupted:
        if (p.namespace, p.name) == (NAMESPACE, job.pod):
            assert len(p.targets) == 1, p
            return p.targets[0].profile
    return job.profile


def check_plan(plan: Plan, label: str) -> list[str]:
    """Everything one plan must satisfy; returns the failures (empty when it is right)."""
    bad: list[str] = []
    for job in BURSTS:
        node = plan.node(job.node)
        assert node is not None
        got = profile_after(node, job)
        need = math.ceil(job.level * _slices(job.profile) - 1e-9)
        if _slices(got) < need:
            bad.append(f"{label}: {job.pod} ({job.level:.0%} of {job.profile}) shrunk to {got}")
    tight = plan.node("tight")
    if tight is None or tight.changed:
        bad.append(f"{label}: the optimal node 'tight' changes")
    # (the history carries no nvidia.com/mig.strategy label: the note naming the nodes planned as
    # mixed for want of it is not about 'tight' being tight)
    about = [n for n in plan.notes if "tight" in n and "nvidia.com/mig.strategy" not in n]
    if about:
        bad.append(f"{label}: a note about 'tight': {about}")
    burst = plan.node("burst-a")
    assert burst is not None
    # The 2g pod at 1 % needs only a 1g slice: every plan shrinks it, so the plans do change something.
    if not burst.changed or profile_after(burst, JOBS[2]) != "1g.10gb":
        bad.append(f"{label}: idle-2g is not shrunk to 1g.10gb")
    bad += check_disruption(burst, plan.notes, label)
    return bad


def check_disruption(node: NodePlan, notes: tuple[str, ...], label: str) -> list[str]:
    """Independent reading: pods on GPUs whose layout changes are evicted, nobody else unless moved;
    after the plan every pod's request is a slot of the proposed layout; one note per resize."""
    bad: list[str] = []
    jobs = {j.pod: j for j in JOBS if j.node == node.name}
    gone = {(p.namespace, p.name) for p in node.pods_disrupted}
    kept = {(p.namespace, p.name) for p in node.pods_kept}
    if gone & kept or gone | kept != {(NAMESPACE, pod) for pod in jobs}:
        bad.append(f"{label}: disrupted {sorted(gone)} and kept {sorted(kept)} do not split the node's pods")
    now = {g.index: g for g in node.current}
    changed_gpus = {
        g.index
        for g in node.proposed
        if (g.mig_enabled, dict(g.mig_devices)) != (now[g.index].mig_enabled, dict(now[g.index].mig_devices))
    }
    mode_flip = any(g.mig_enabled != now[g.index].mig_enabled for g in node.proposed)
    use: Counter[tuple[int, str]] = Counter()
    for pod, job in jobs.items():
        evicted = (NAMESPACE, pod) in gone
        if (job.gpu in changed_gpus or mode_flip) and not evicted:
            bad.append(f"{label}: {pod} stays on GPU {job.gpu} whose layout changes")
        if not job.profile:
            continue
        if evicted:
            target = next(p for p in node.pods_disrupted if p.name == pod).targets[0]
            use[(target.gpu, target.profile)] += 1
        else:
            use[(job.gpu, job.profile)] += 1
    for (gpu, profile), n in use.items():
        have = next(g for g in node.proposed if g.index == gpu).mig_devices.get(profile, 0)
        if n > have:
            bad.append(f"{label}: {n} pod(s) want {profile} on GPU {gpu}, the layout has {have}")
    resized = {p.name for p in node.pods_disrupted for t in p.targets if t.profile != jobs[p.name].profile}
    noted = {n.split("pod ml/")[1].split(" ")[0] for n in notes if " moves from nvidia.com/mig-" in n}
    if resized != noted:
        bad.append(f"{label}: resize notes for {sorted(noted)}, resized pods {sorted(resized)}")
    return bad


@pytest.mark.slow
@pytest.mark.parametrize("window", list(WINDOWS))
def test_no_burst_is_shrunk_at_any_hour(burst_history: History, window: str) -> None:
    failures: list[str] = []
    with PrometheusClient(burst_history.url) as client:
        for at in sweep_times(burst_history.end, **SWEEPS[window]):
            plan = plan_at(client, at, WINDOWS[window])
            failures += check_plan(plan, f"--window {window} --at {time.strftime('%H:%M', time.gmtime(at))}")
    assert not failures, "\n".join(failures[:20])


def test_evidence_names_the_peak_and_its_hour(burst_history: History) -> None:
    with PrometheusClient(burst_history.url) as client:
        plan = plan_at(client, burst_history.end, WINDOWS["2d"])
    node = plan.node("burst-a")
    assert node is not None
    job = next(e for e in node.evidence if e.pod == "ml/job-1h")
    assert job.peak_activity == pytest.approx(0.75, abs=0.01) and job.busy_minutes == 15
    assert job.peak_at.endswith("T03:00:00Z")  # the burst runs from 03:00 to 04:00 UTC every day
    assert job.p95_activity is not None and job.p95_activity < 0.2  # p95 alone would have missed it
    text = "\n".join(plan.notes)
    # idle-2g needs a 1g: a free 1g.10gb on GPU 1 takes it, so no GPU is re-created (one eviction).
    assert "ml/idle-2g moves from nvidia.com/mig-2g.20gb (GPU 0) to nvidia.com/mig-1g.10gb (GPU 1)" in text
    assert node.proposed == node.current and "re-created" not in text
    assert [p.name for p in node.pods_disrupted] == ["idle-2g"]


def test_peak_does_not_depend_on_the_cut(burst_history: History) -> None:
    """The 2 h burst straddles midnight; a window ending inside it still sees a full 15-min mean."""
    midnight = burst_history.end - burst_history.end % 86400
    if midnight + 1800 > burst_history.end:  # the history ends at midnight (run from 01:00 to 02:00 UTC)
        midnight -= 86400
    with PrometheusClient(burst_history.url) as client:
        inside = plan_at(client, midnight + 1800, WINDOWS["1d"])
    node = inside.node("burst-a")
    assert node is not None
    two_h = next(e for e in node.evidence if e.pod == "ml/job-2h")
    assert two_h.peak_activity == pytest.approx(0.80, abs=0.01)


def _seed(kube: KubeDouble, node: NodePlan) -> None:
    """The node and its GPU pods as the cluster has them, with the node's current layout as a config."""
    name = "current-layout"
    cm = kube.configmap("default-mig-parted-config")
    assert cm is not None
    doc = yaml.safe_load(cm["data"]["config.yaml"])
    doc["mig-configs"][name] = [
        {"devices": [g.index], "mig-enabled": g.mig_enabled, "mig-devices": dict(g.mig_devices)}
        for g in node.current
    ]
    kube.add_configmap("default-mig-parted-config", data={"config.yaml": yaml.safe_dump(doc)})
    kube.add_node(node.name, gpus=len(node.current), mig_config=name)
    for job in JOBS:
        if job.node != node.name:
            continue
        resource = f"nvidia.com/mig-{job.profile}" if job.profile else "nvidia.com/gpu"
        # each pod from a Deployment of its own, so apply can give a resized one its new request
        fromplan.add_deployment(
            kube,
            namespace=NAMESPACE,
            name=job.pod,
            node=node.name,
            requests={resource: "1"},
            pods=[{"name": job.pod, "devices": [{"gpu": job.gpu}]}],
        )
    kube.add_pod("cpu-only", namespace=NAMESPACE, node=node.name, resources={"cpu": 1})


def test_plan_dry_run_and_apply_evict_the_same_pods(burst_history: History) -> None:
    with PrometheusClient(burst_history.url) as client:
        plan = plan_at(client, burst_history.end - 5 * 3600, WINDOWS["2d"])
    node = plan.node("burst-a")
    assert node is not None and node.changed
    # Plans name "custom" as the current config (from kube_node_labels); the double knows it by its layout.
    plan = _with_current_config(plan, "current-layout")
    node = plan.node("burst-a")
    assert node is not None
    listed = {(p.namespace, p.name) for p in node.pods_disrupted}
    assert listed and node.pods_kept  # some pods keep running: their GPUs keep their layout
    with KubeDouble() as kube:
        _seed(kube, node)
        k = Kube(kube.api_client())
        script = dryrun.dry_run_script(k, plan, FAST)
        in_script = {
            (line.split("/namespaces/")[1].split("/")[0], line.split("/pods/")[1].split("/")[0])
            for line in script.splitlines()
            if line.startswith("kubectl create --raw") and "/eviction" in line
        }
        report = Applier(k, plan, FAST).run()
        assert [o.result for o in report.outcomes] == ["applied"], report.outcomes
        evicted = {(a.namespace, a.name) for a in kube.actions(verb="evict", resource="pods")}
        left = {(p["metadata"]["namespace"], p["metadata"]["name"]) for p in kube.pods(node=node.name)}
        resized = [c for o in report.outcomes for c in o.workloads if c.change.moves]
    assert in_script == listed
    assert evicted == listed
    original = {(NAMESPACE, j.pod) for j in JOBS if j.node == node.name} | {(NAMESPACE, "cpu-only")}
    assert {(p.namespace, p.name) for p in node.pods_kept} | {(NAMESPACE, "cpu-only")} == left & original
    # every evicted pod's replacement runs on the node again, a resized one with its new request
    assert len(left - original) == len(listed)
    assert resized and all(r.running == r.desired == 1 for r in resized)


def _with_current_config(plan: Plan, name: str) -> Plan:
    import dataclasses  # noqa: PLC0415

    nodes = tuple(dataclasses.replace(n, current_config_name=name) if n.changed else n for n in plan.nodes)
    return dataclasses.replace(plan, nodes=nodes)
