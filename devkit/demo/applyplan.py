"""The demo applies its plan: to a simulated cluster built from the plan (the Kubernetes API double with
its MIG Manager, device plugin, scheduler and controllers, ``python -m tests.support.kubedouble``, on
127.0.0.1), first ``apply --dry-run`` and then ``apply --yes``, whose table ends with every resized
workload Running on the new layout; then a check that no pod is left Pending."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

from devkit.demo import commands
from devkit.demo.console import Console, StepFailed
from devkit.demo.procs import Supervisor
from devkit.demo.settings import DemoSettings

START_TIMEOUT_S = 30.0


def start_cluster(sup: Supervisor, settings: DemoSettings, plan: Path) -> Path:
    """Start the simulated cluster for ``plan``; returns its kubeconfig once it answers."""
    kubeconfig = settings.work / "cluster" / "kubeconfig"
    kubeconfig.parent.mkdir(parents=True, exist_ok=True)
    kubeconfig.unlink(missing_ok=True)
    argv = [
        sys.executable,
        "-m",
        "tests.support.kubedouble",
        "--plan",
        str(plan),
        "--kubeconfig",
        str(kubeconfig),
    ]
    path = os.pathsep.join(p for p in (str(settings.root), os.environ.get("PYTHONPATH", "")) if p)
    service = sup.start("cluster", argv, env={**os.environ, "PYTHONPATH": path})
    deadline = time.monotonic() + START_TIMEOUT_S
    while not kubeconfig.exists():
        if service.proc.poll() is not None:
            raise StepFailed(f"the simulated cluster exited: {service.log_tail()} (log {service.log})")
        if time.monotonic() > deadline:
            raise StepFailed(
                f"the simulated cluster did not start within {START_TIMEOUT_S:.0f}s (log {service.log})"
            )
        time.sleep(0.05)
    return kubeconfig


def changed_nodes(plan: Path) -> int:
    return sum(1 for n in json.loads(plan.read_text()).get("nodes") or [] if n.get("changed"))


def show(con: Console, settings: DemoSettings, sup: Supervisor, plan: Path) -> None:
    started = time.monotonic()
    if not plan.exists():
        raise StepFailed(f"no {plan}: the plan step did not write one")
    kubeconfig = start_cluster(sup, settings, plan)
    con.note((settings.logs / "cluster.log").read_text().strip().splitlines()[-1])
    base = ["apply", "--plan", str(plan), "--kubeconfig", str(kubeconfig), "--repoint-cluster-policy"]
    dry = commands.run("gpupilot-rightsizer", [*base, "--dry-run"], root=settings.root, timeout=60)
    con.line(f"$ {dry.shown}")
    lines = dry.stdout.splitlines()
    patches = [ln for ln in lines if ln.startswith("kubectl patch ") and "clusterpolicies" not in ln]
    con.line(
        f"  {len(lines)} lines: {sum(ln.startswith('kubectl ') for ln in lines)} kubectl commands, "
        f"{len(patches)} workload template patch(es), e.g."
    )
    for ln in (patches or [ln for ln in lines if ln.startswith("# node")])[:2]:
        con.line(f"    {ln[:150]}{'…' if len(ln) > 150 else ''}")
    width = max(1, min(changed_nodes(plan), 4))
    args = [*base, "--yes", "--configmap-sync", "0", "--max-parallel", str(width)]
    res = commands.run("gpupilot-rightsizer", args, root=settings.root, timeout=300, ok_codes=(0, 1))
    con.line(f"$ {res.shown}")
    for ln in res.stdout.rstrip().splitlines():
        con.line(f"  {ln}")
    if res.code != 0:
        raise StepFailed(f"apply did not finish every node: {res.stderr.strip().splitlines()[-1:]}")
    if not shutil.which("kubectl"):
        con.note("kubectl not found: the check that no pod is Pending is skipped")
        return
    pending = commands.kubectl(
        ["get", "pods", "--all-namespaces", "--field-selector=status.phase=Pending", "-o", "name"],
        kubeconfig=kubeconfig,
    )
    left = pending.stdout.split()
    if left:
        raise StepFailed(f"{len(left)} pod(s) Pending after apply: {', '.join(left[:5])}")
    con.line(
        f"  kubectl get pods -A --field-selector=status.phase=Pending: none ({time.monotonic() - started:.1f}s)"
    )
