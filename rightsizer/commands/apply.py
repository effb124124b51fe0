"""``gpupilot-rightsizer apply --plan plan.json``: reconfigure nodes through the MIG Manager, safely."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TextIO

from gpupilot_common import argtypes
from gpupilot_common.table import Column, render
from rightsizer.apply import dryrun
from rightsizer.apply.applier import Applier, ApplyError, ApplyReport, ApplySettings
from rightsizer.apply.plancheck import check_plan
from rightsizer.clients.kube import Kube, KubeError, KubeSettings
from rightsizer.plan import clusters
from rightsizer.plan.model import Plan, PlanError, load_plan

_duration = argtypes.duration(maximum=86400.0)
_duration_or_zero = argtypes.duration(maximum=86400.0, allow_zero=True)
_positive = argtypes.whole(low=1, high=1000)
_lease = argtypes.duration(minimum=1.0, maximum=3600.0)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Apply a plan made by 'plan': write its mig-parted configs into the MIG Manager's ConfigMap "
        "(keeping every config already there) and point the ClusterPolicy at it; then, node by node: "
        "cordon, evict the GPU pods the change disrupts (the plan's pods_disrupted, plus GPU pods started "
        "since the plan; pods on GPUs that keep their layout keep running) through the Eviction API "
        "(PodDisruptionBudgets respected), relabel nvidia.com/mig.config and wait for nvidia.com/mig.config.state=success. "
        "A failure or timeout restores the previous label, uncordons, records an Event and stops. "
        "Pods whose MIG profile changes need a new request: their workloads' pod templates are changed "
        "first (--workloads), and a node is done only when every disrupted workload is Running and Ready "
        "again with its new request (--settle-timeout); a replacement that could not fit refuses the node "
        "before any eviction. "
        "Progress is recorded in node annotations (gpupilot.io/*), so running it again resumes. "
        "Nothing changes without --yes (or a 'y' on a terminal); --dry-run prints the kubectl commands."
    )
    parser.add_argument(
        "--plan", type=Path, required=True, metavar="FILE", help="plan JSON written by 'plan --out'"
    )
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        default=None,
        metavar="FILE",
        help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config, then the in-cluster service account)",
    )
    parser.add_argument(
        "--context", default=None, metavar="NAME", help="kubeconfig context (default: the current one)"
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="read the cluster and print the exact kubectl commands apply would run; change nothing",
    )
    parser.add_argument(
        "--yes",
        action="store_true",
        help="do not ask for confirmation (required when stdin is not a terminal)",
    )
    parser.add_argument(
        "--max-parallel",
        type=_positive,
        default=1,
        metavar="N",
        help="nodes reconfigured at once; a failure in a batch stops the later batches (default 1)",
    )
    parser.add_argument(
        "--timeout",
        type=_duration,
        default=900.0,
        metavar="DURATION",
        help="per node: time allowed from relabel to mig.config.state=success, e.g. 15m (default 15m)",
    )
    parser.add_argument(
        "--eviction-timeout",
        type=_duration,
        default=300.0,
        metavar="DURATION",
        help="per node: time allowed for evictions refused by PodDisruptionBudgets and pods to go (default 5m)",
    )
    parser.add_argument(
        "--configmap-sync",
        type=_duration_or_zero,
        default=60.0,
        metavar="DURATION",
        help="wait after changing the ConfigMap before relabelling, for kubelet to deliver it to the "
        "MIG Manager (default 60s; 0 to skip)",
    )
    parser.add_argument(
        "--lease-duration",
        type=_lease,
        default=60.0,
        metavar="DURATION",
        help="the apply Lease (one apply at a time, in --namespace) expires this long after its holder "
        "stopped renewing it: a run killed mid-apply is taken over by the next one after this wait; "
        "renewed every third of it (default 60s; 1s to 1h)",
    )
    parser.add_argument(
        "--configmap",
        default=None,
        metavar="NAME",
        help="mig-parted ConfigMap to write (default: the one the ClusterPolicy uses, or "
        "gpupilot-mig-parted-config when that is the operator's default-mig-parted-config)",
    )
    parser.add_argument(
        "--namespace",
        default="gpu-operator",
        metavar="NS",
        help="GPU Operator namespace (default gpu-operator)",
    )
    parser.add_argument(
        "--cluster",
        default=None,
        metavar="NAME",
        help="apply only this cluster's changes of a plan over several clusters (the cluster the kubeconfig "
        "points at: the plan's cluster label value); required for such a plan",
    )
    parser.add_argument(
        "--cluster-policy", default=None, metavar="NAME", help="ClusterPolicy name (default: the only one)"
    )
    parser.add_argument(
        "--repoint-cluster-policy",
        action="store_true",
        help="allow pointing the ClusterPolicy's spec.migManager.config.name at the ConfigMap apply writes "
        "when it points elsewhere (a cluster-wide change; without it apply refuses). Undone if no node "
        "takes the new configs",
    )

    parser.add_argument(
        "--workloads",
        choices=("patch", "gitops"),
        default="patch",
        help="how disrupted workloads whose MIG profile changes get their new GPU request: 'patch' "
        "(default) sets it in their pod templates (Deployment, StatefulSet); 'gitops' writes a kustomize "
        "patch per workload and a unified diff to --gitops-dir and waits for the live templates to change "
        "before evicting anything",
    )
    parser.add_argument(
        "--settle-timeout",
        type=_duration,
        default=600.0,
        metavar="DURATION",
        help="per node: after the MIG Manager's success, time allowed for every disrupted workload to have "
        "its desired replicas Running and Ready with the new request; else the node is rolled back "
        "(default 10m)",
    )
    parser.add_argument(
        "--gitops-dir",
        type=Path,
        default=Path("gpupilot-patches"),
        metavar="DIR",
        help="--workloads gitops: where the patches go, in a folder per plan id (default gpupilot-patches)",
    )
    parser.add_argument(
        "--gitops-timeout",
        type=_duration,
        default=1800.0,
        metavar="DURATION",
        help="--workloads gitops: per node, time allowed for the live templates to change (default 30m)",
    )


def settings_from(args: argparse.Namespace) -> ApplySettings:
    return ApplySettings(
        namespace=args.namespace,
        configmap=args.configmap,
        cluster_policy=args.cluster_policy,
        repoint_cluster_policy=args.repoint_cluster_policy,
        max_parallel=args.max_parallel,
        timeout_s=args.timeout,
        eviction_timeout_s=args.eviction_timeout,
        configmap_sync_s=args.configmap_sync,
        lease_duration_s=round(args.lease_duration),
        workloads=args.workloads,
        settle_timeout_s=args.settle_timeout,
        gitops_dir=args.gitops_dir,
        gitops_timeout_s=args.gitops_timeout,
    )


def confirm(plan: Plan, *, stdin: TextIO, stderr: TextIO) -> bool:
    changed = plan.changed_nodes
    if not stdin.isatty():
        print(
            "error: refusing to change the cluster without --yes (stdin is not a terminal); "
            "try --dry-run first to see what would happen",
            file=stderr,
        )
        return False
    names = ", ".join(n.name for n in changed[:8]) + (" …" if len(changed) > 8 else "")
    stderr.write(
        f"Plan {plan.plan_id}: reconfigure {len(changed)} node(s) ({names}); "
        f"{sum(len(n.pods_disrupted) for n in changed)} pod(s) listed in the plan will be evicted. "
        "Continue? [y/N] "
    )
    stderr.flush()
    return stdin.readline().strip().lower() in ("y", "yes")


APPLY_COLUMNS = (Column("NODE"), Column("RESULT"), Column("SECONDS", right=True), Column("DETAIL", wrap=True))
WORKLOAD_COLUMNS = (
    Column("WORKLOAD", wrap=True),
    Column("NODE"),
    Column("OLD REQUEST", wrap=True),
    Column("NEW REQUEST", wrap=True),
    Column("RUNNING", right=True),
)


def print_report(report: ApplyReport, out: TextIO) -> None:
    print(
        f"plan {report.plan_id}: ConfigMap {report.configmap} "
        f"{'updated' if report.configmap_changed else 'unchanged'}"
        f"{', ClusterPolicy repointed' if report.cluster_policy_patched else ''}",
        file=out,
    )
    rows = [
        (o.node, o.result, f"{o.seconds:.1f}", o.reason or f"{o.previous} → {o.target}")
        for o in report.outcomes
    ]
    print(render(APPLY_COLUMNS, rows), file=out)
    if report.configs_restored:
        print(f"undone: {report.configs_restored}", file=out)
    workloads = [
        (
            w.change.ref,
            o.node,
            w.change.old_request or "(unchanged)",
            w.change.new_request or "(unchanged)",
            f"{w.running}/{w.desired}",
        )
        for o in report.outcomes
        for w in o.workloads
    ]
    if workloads:
        print(file=out)
        print(render(WORKLOAD_COLUMNS, workloads), file=out)


def run(args: argparse.Namespace) -> int:
    try:
        plan = load_plan(args.plan)
        check_plan(plan, source=str(args.plan))
        plan = clusters.for_apply(plan, args.cluster, source=str(args.plan))
    except PlanError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not plan.changed_nodes:
        print(f"plan {plan.plan_id}: no node changes; nothing to apply")
        return 0
    settings = settings_from(args)
    kube: Kube | None = None
    try:
        kube = Kube.connect(KubeSettings(kubeconfig=args.kubeconfig, context=args.context))
        if args.dry_run:
            sys.stdout.write(dryrun.dry_run_script(kube, plan, settings))
            return 0
        if not args.yes and not confirm(plan, stdin=sys.stdin, stderr=sys.stderr):
            return 2 if not sys.stdin.isatty() else 1

        def progress(node: str, message: str) -> None:
            print(f"[{node}] {message}", file=sys.stderr, flush=True)

        report = Applier(kube, plan, settings, progress=progress).run()
    except (ApplyError, KubeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        if kube is not None:
            kube.close()
    print_report(report, sys.stdout)
    return 0 if report.ok and not report.interrupted else 1
