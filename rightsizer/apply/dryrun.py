"""``apply --dry-run``: the exact ``kubectl`` commands apply would run, as a script, changing nothing.

Evictions are spelled as ``kubectl create --raw …/pods/NAME/eviction`` with a policy/v1 Eviction body:
that is the Eviction API apply uses (PodDisruptionBudgets respected), unlike ``kubectl delete pod``;
``kubectl drain`` would also do it but evicts every pod on the node, not only those the change
disrupts (:func:`rightsizer.plan.disruption.evictions`, the same rule apply uses).
The ConfigMap is written with ``kubectl create``/``replace`` carrying the ``resourceVersion`` read now, so
the script fails rather than overwrite a concurrent change.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from rightsizer.apply import fit
from rightsizer.apply import protocol as proto
from rightsizer.apply import record as inflight
from rightsizer.apply import workloads as wl
from rightsizer.apply.configmap import DATA_KEY, dump_yaml
from rightsizer.apply.configs import ConfigTarget, resolve_config_target
from rightsizer.apply.settings import ApplySettings
from rightsizer.clients.kube import Kube, NotFoundError, PermanentKubeError
from rightsizer.plan.disruption import evictions
from rightsizer.plan.model import Plan


def _q(text: str) -> str:
    return shlex.quote(text)


def _annotate(node: str, values: dict[str, str], *, stamp: str = "") -> str:
    """``stamp``: an annotation whose value is the time the command runs (bash expands it)."""
    pairs = " ".join(_q(f"{k}={v}") for k, v in values.items())
    now = f' {_q(stamp + "=")}"$(date -u +%Y-%m-%dT%H:%M:%SZ)"' if stamp else ""
    return f"kubectl annotate node {_q(node)} --overwrite {pairs}{now}"


def _configmap_commands(target: ConfigTarget, settings: ApplySettings) -> list[str]:
    lines = [
        f"# 1. mig-parted ConfigMap {settings.namespace}/{target.configmap}: keeps {len(target.merge.kept)} "
        f"config(s), adds {', '.join(target.merge.added) or 'none'}"
        + (f", replaces {', '.join(target.merge.replaced)}" if target.merge.replaced else "")
    ]
    if target.changed:
        meta: dict[str, Any] = {"name": target.configmap, "namespace": settings.namespace}
        verb = "create"
        data = {DATA_KEY: target.merge.render()}
        if target.existing is not None:
            verb = "replace"
            meta["resourceVersion"] = target.existing["metadata"]["resourceVersion"]
            data = {**(target.existing.get("data") or {}), **data}
        manifest = dump_yaml({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data})
        # --validate=false: the manifest is generated here; kubectl need not download schemas to check it
        lines += [
            f"kubectl {verb} --validate=false -f - <<'GPUPILOT_EOF'",
            manifest.rstrip("\n"),
            "GPUPILOT_EOF",
        ]
    else:
        lines.append("#    (already holds every config of the plan: unchanged)")
    if target.repoint:
        patch = json.dumps({"spec": {"migManager": {"config": {"name": target.configmap}}}})
        lines += [
            f"# 2. point the MIG Manager at it (ClusterPolicy {target.cluster_policy})",
            f"kubectl patch clusterpolicies.nvidia.com {_q(target.cluster_policy)} --type=merge -p {_q(patch)}",
        ]
    if (target.changed or target.repoint) and settings.configmap_sync_s > 0:
        lines.append(
            f"sleep {settings.configmap_sync_s:.0f}  # let kubelet deliver the ConfigMap to the MIG Manager"
        )
    return lines


def _records(kube: Kube, settings: ApplySettings) -> tuple[dict[str, inflight.Record], list[str]]:
    """The in-flight record (read-only), and a comment when it cannot be read."""
    ledger = inflight.InFlightRecord(kube, settings.namespace)
    try:
        return ledger.load(), []
    except PermanentKubeError as exc:
        if exc.status != 403:
            raise
        return {}, [f"# not allowed to read the in-flight record {ledger.where} (HTTP 403): shown as empty"]


def _in_flight_comments(kube: Kube, plan: Plan, records: dict[str, inflight.Record]) -> list[str]:
    """Nodes another run left in flight that this plan does not change: apply rolls them back first."""
    changed = {n.name for n in plan.changed_nodes}
    lines = []
    for raw in sorted(
        (proto.view(n) for n in kube.list_nodes(label_selector=proto.CONFIG_LABEL)), key=lambda v: v.name
    ):
        if note := inflight.unrecorded(raw, records.get(raw.name)):
            lines.append(f"# node {raw.name}: {note}")
        node = inflight.trusted_view(raw, records.get(raw.name))
        if node.in_flight and node.name not in changed:
            decision = proto.orphan_decision(node, current=None, target=None)
            lines.append(f"# node {node.name}: {decision.reason}; apply does this before any other node")
    return lines


def _node_commands(kube: Kube, plan: Plan, settings: ApplySettings) -> list[str]:
    records, lines = _records(kube, settings)
    lines += _in_flight_comments(kube, plan, records)
    escaped_state = proto.STATE_LABEL.replace(".", "\\.")
    for pn in plan.changed_nodes:
        try:
            node = inflight.trusted_view(proto.view(kube.get_node(pn.name)), records.get(pn.name))
        except NotFoundError:
            lines.append(f"# node {pn.name}: skipped: node not found")
            continue
        decision = proto.decide(
            node, plan_id=plan.plan_id, current=pn.current_config_name, target=pn.config_name
        )
        if decision.action != "start":
            lines.append(f"# node {pn.name}: {decision.action}: {decision.reason}")
            continue
        live_gpu_pods = [p for p in kube.pods_on_node(pn.name) if proto.holds_gpus(p)]
        gpu_pods = [proto.pod_key(p)[:2] for p in live_gpu_pods]
        holders = evictions(pn, gpu_pods)
        n = pn.name
        try:
            changes = wl.resolve(kube, pn, live_gpu_pods, {(e.namespace, e.name) for e in holders})
            short = (
                fit.shortfall(
                    node=n,
                    proposed=pn.proposed,
                    strategy=pn.mig_strategy,
                    nodes=kube.list_nodes(),
                    pods=kube.list_pods(),
                    evicted={(e.namespace, e.name) for e in holders},
                    changes=changes,
                )
                if changes
                else ""
            )
            if short:
                raise wl.WorkloadRefused(f"the replacements would not fit: {short}")
        except wl.WorkloadRefused as exc:
            lines += ["", f"# node {n}: refused, nothing would change: {exc}"]
            continue
        lines += [
            "",
            f"# node {n}: {pn.current_config_name} → {pn.config_name} (frees {pn.gpus_freed} GPU(s), "
            f"{pn.slices_freed} slice(s); {len(holders)} pod(s) to evict, "
            f"{len(gpu_pods) - len(holders)} GPU pod(s) keep running)",
            _annotate(
                n,
                {
                    proto.ANN_PLAN: plan.plan_id,
                    proto.ANN_PREVIOUS: node.config,
                    proto.ANN_TARGET: pn.config_name,
                    proto.ANN_WAS_UNSCHEDULABLE: str(node.unschedulable).lower(),
                    proto.ANN_STEP: str(proto.Step.CORDONED),
                    **(
                        {wl.ANN_WORKLOADS: wl.encode(changes), wl.ANN_WORKLOAD_MODE: settings.workloads}
                        if changes
                        else {}
                    ),
                },
                stamp=proto.ANN_CORDONED_AT,
            ),
            f"kubectl cordon {_q(n)}",
            *_workload_commands(kube, changes, settings, plan_id=plan.plan_id),
            _annotate(n, {proto.ANN_STEP: str(proto.Step.REQUESTS_SET)}),
        ]
        for ev in holders:
            ns, name = ev.namespace, ev.name
            lines.append(f"# evict {ns}/{name}: {ev.reason}")
            body = json.dumps(
                {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": ns}}
            )
            lines += [
                f"kubectl create --raw /api/v1/namespaces/{ns}/pods/{name}/eviction -f - <<'GPUPILOT_EOF'",
                body,
                "GPUPILOT_EOF",
                f"kubectl wait --for=delete pod/{_q(name)} --namespace {_q(ns)} --timeout={settings.eviction_timeout_s:.0f}s",
            ]
        lines += [
            _annotate(n, {proto.ANN_STEP: str(proto.Step.DRAINED)}),
            f"kubectl label node {_q(n)} --overwrite {_q(f'{proto.CONFIG_LABEL}={pn.config_name}')} {_q(proto.STATE_LABEL + '-')}",
            _annotate(n, {proto.ANN_STEP: str(proto.Step.RELABELED)}),
            f"kubectl wait node/{_q(n)} --for={_q(f'jsonpath={{.metadata.labels.{escaped_state}}}=success')} "
            f"--timeout={settings.timeout_s:.0f}s",
            *([] if node.unschedulable else [f"kubectl uncordon {_q(n)}"]),
            _annotate(n, {proto.ANN_STEP: str(proto.Step.SETTLING)}),
            *(
                f"kubectl rollout status {c.kind.lower()}/{_q(c.name)} --namespace {_q(c.namespace)} "
                f"--timeout={settings.settle_timeout_s:.0f}s  # {c.replicas} replica(s) Running and Ready"
                for c in changes
                if c.kind in ("Deployment", "StatefulSet")
            ),
            _annotate(n, {proto.ANN_STEP: str(proto.Step.DONE)}),
        ]
    return lines


def _workload_commands(
    kube: Kube, changes: tuple[wl.Change, ...], settings: ApplySettings, *, plan_id: str
) -> list[str]:
    """The template patches (``--workloads patch``), or what gitops mode writes and waits for."""
    lines: list[str] = []
    for c in changes:
        if not c.moves:
            continue
        lines.append(f"# {c.ref}: {c.old_request} → {c.new_request} (pods {', '.join(c.pods)})")
        obj = kube.get_workload(c.kind, c.namespace, c.name)
        if settings.workloads == "gitops":
            lines.append(
                f"#   --workloads gitops: apply writes {settings.gitops_dir}/{plan_id}/{c.namespace}."
                f"{c.kind.lower()}.{c.name}.yaml and waits up to {settings.gitops_timeout_s:.0f}s for the live template"
            )
            continue
        patch = json.dumps(wl.template_patch(obj, c.kind, c.moves, plan_id=plan_id), separators=(",", ":"))
        lines.append(
            f"kubectl patch {c.kind.lower()} {_q(c.name)} --namespace {_q(c.namespace)} --type=merge -p {_q(patch)}"
        )
    return lines


def dry_run_script(kube: Kube, plan: Plan, settings: ApplySettings) -> str:
    """Reads the cluster (ClusterPolicy, ConfigMaps, nodes, pods) and returns the script; writes nothing."""
    target = resolve_config_target(kube, plan, settings)
    header = [
        "#!/usr/bin/env bash",
        f"# gpupilot-rightsizer apply --dry-run: plan {plan.plan_id}, {len(plan.changed_nodes)} node(s) to change.",
        "# Nothing was changed. These are the commands apply would run, in order (one node at a time here;",
        f"# apply runs up to --max-parallel={settings.max_parallel} nodes at once and rolls a node back if",
        f"# {proto.STATE_LABEL} becomes failed). Evictions go through the Eviction API (PodDisruptionBudgets apply).",
        "set -euo pipefail",
    ]
    return (
        "\n".join([*header, *_configmap_commands(target, settings), *_node_commands(kube, plan, settings)])
        + "\n"
    )
