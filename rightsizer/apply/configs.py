"""Step 1 of ``apply``: the mig-parted ConfigMap (merged, never dropping configs) and the ClusterPolicy."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rightsizer.apply import configmap as mig_configmap
from rightsizer.apply.settings import ApplyError, ApplySettings
from rightsizer.clients.kube import ConflictError, Kube
from rightsizer.plan.model import Plan

log = logging.getLogger(__name__)

Progress = Callable[[str, str], None]


@dataclass(frozen=True)
class ConfigTarget:
    """Where the plan's configs go, and what it takes to get them there."""

    configmap: str
    cluster_policy: str
    repoint: bool
    merge: mig_configmap.Merge
    existing: dict[str, Any] | None
    changed: bool
    pointed: str = ""
    """The ConfigMap the ClusterPolicy pointed at before this run."""
    written_rv: str = ""
    """resourceVersion of the ConfigMap as this run wrote it ("" when unchanged)."""
    policy_rv: str = ""
    """resourceVersion of the ClusterPolicy as this run patched it ("" when not repointed)."""


def resolve_config_target(kube: Kube, plan: Plan, settings: ApplySettings) -> ConfigTarget:
    policies = kube.list_cluster_policies()
    if settings.cluster_policy:
        policies = [p for p in policies if p["metadata"]["name"] == settings.cluster_policy]
    if len(policies) != 1:
        which = (
            f"ClusterPolicy {settings.cluster_policy!r}"
            if settings.cluster_policy
            else "exactly one ClusterPolicy"
        )
        raise ApplyError(
            f"expected {which} (clusterpolicies.nvidia.com), found {len(policies)}: is the GPU Operator installed?"
        )
    policy = policies[0]
    name = policy["metadata"]["name"]
    cfg = ((policy.get("spec") or {}).get("migManager") or {}).get("config") or {}
    pointed = str(cfg.get("name") or mig_configmap.OPERATOR_DEFAULT_CONFIGMAP)
    operator_ns = (policy.get("status") or {}).get("namespace")
    if operator_ns and operator_ns != settings.namespace:
        raise ApplyError(
            f"ClusterPolicy {name} says the GPU Operator runs in namespace {operator_ns}, not "
            f"{settings.namespace}: pass --namespace {operator_ns}"
        )
    target = settings.configmap or (
        pointed if pointed != mig_configmap.OPERATOR_DEFAULT_CONFIGMAP else mig_configmap.GPUPILOT_CONFIGMAP
    )
    try:
        current = kube.get_configmap(settings.namespace, pointed)
        if current is None:
            raise ApplyError(
                f"ClusterPolicy {name} points the MIG Manager at ConfigMap {pointed}, which is not in "
                f"namespace {settings.namespace}: pass the GPU Operator's namespace with --namespace"
            )
        if pointed != target and not settings.repoint_cluster_policy:
            alternative = (
                " (the operator rewrites its own default ConfigMap, so apply does not write it)"
                if pointed == mig_configmap.OPERATOR_DEFAULT_CONFIGMAP
                else f", or --configmap {pointed}"
            )
            raise ApplyError(
                f"ClusterPolicy {name} points the MIG Manager at ConfigMap {pointed}; writing {target} "
                "needs the ClusterPolicy repointed, a cluster-wide change: pass --repoint-cluster-policy "
                f"to allow it{alternative}"
            )
        existing = current if target == pointed else kube.get_configmap(settings.namespace, target)
        sources = []
        if pointed != target:
            sources.append(mig_configmap.configs_of(current))
        sources.append(mig_configmap.configs_of(existing))
    except mig_configmap.ConfigMapError as exc:
        raise ApplyError(str(exc)) from exc
    merged = mig_configmap.merge(existing=sources, wanted=mig_configmap.plan_configs(plan))
    if merged.replaced:
        raise ApplyError(
            f"ConfigMap {settings.namespace}/{target} already holds config {merged.replaced[0]} with different "
            "content; apply never changes an existing config (nodes may use it): re-run 'plan'"
        )
    changed = existing is None or mig_configmap.configs_of(existing) != merged.configs
    return ConfigTarget(target, name, pointed != target, merged, existing, changed, pointed=pointed)


def write_configs(kube: Kube, plan: Plan, settings: ApplySettings, *, progress: Progress) -> ConfigTarget:
    """Step 1: merge the plan's configs into the ConfigMap and point the ClusterPolicy at it (409s retried)."""
    for _ in range(settings.conflict_retries):
        target = resolve_config_target(kube, plan, settings)
        written_rv = policy_rv = ""
        try:
            if target.changed:
                data = {mig_configmap.DATA_KEY: target.merge.render()}
                if target.existing is None:
                    written = kube.create_configmap(settings.namespace, target.configmap, data)
                else:
                    updated = dict(target.existing)
                    updated["data"] = {**(target.existing.get("data") or {}), **data}
                    written = kube.replace_configmap(updated)
                written_rv = str((written.get("metadata") or {}).get("resourceVersion", ""))
                progress(
                    "-",
                    f"ConfigMap {settings.namespace}/{target.configmap}: added {len(target.merge.added)}, "
                    f"kept {len(target.merge.kept)} config(s)",
                )
            if target.repoint:
                policy = kube.list_cluster_policies()
                rv = next(p for p in policy if p["metadata"]["name"] == target.cluster_policy)["metadata"][
                    "resourceVersion"
                ]
                patched = kube.patch_cluster_policy(
                    target.cluster_policy,
                    {
                        "metadata": {"resourceVersion": rv},
                        "spec": {"migManager": {"config": {"name": target.configmap}}},
                    },
                )
                progress(
                    "-",
                    f"ClusterPolicy {target.cluster_policy}: migManager.config.name={target.configmap}",
                )
                policy_rv = str((patched.get("metadata") or {}).get("resourceVersion", ""))
            return dataclasses.replace(target, written_rv=written_rv, policy_rv=policy_rv)
        except ConflictError as exc:
            log.info("conflict writing configs, retrying: %s", exc)
    raise ApplyError(
        f"ConfigMap {target.configmap}: kept conflicting after {settings.conflict_retries} tries"
    )


def restore_configs(kube: Kube, target: ConfigTarget, settings: ApplySettings) -> str:
    """Undo step 1 after a run in which no node took the new configs; returns what was done.

    Only what this run wrote and nobody changed since (same resourceVersion) is restored: the
    ClusterPolicy's pointer, and the ConfigMap's previous content when this run replaced it. A
    ConfigMap this run created is left (nothing points at it any more; apply has no delete right).
    """
    done: list[str] = []
    if target.repoint and target.policy_rv:
        policy = next(
            (p for p in kube.list_cluster_policies() if p["metadata"]["name"] == target.cluster_policy), None
        )
        if policy is not None and str(policy["metadata"].get("resourceVersion")) == target.policy_rv:
            kube.patch_cluster_policy(
                target.cluster_policy,
                {
                    "metadata": {"resourceVersion": target.policy_rv},
                    "spec": {"migManager": {"config": {"name": target.pointed}}},
                },
            )
            done.append(f"ClusterPolicy {target.cluster_policy} points at {target.pointed} again")
        else:
            done.append(f"ClusterPolicy {target.cluster_policy} changed by someone else since; left as it is")
    if target.changed and target.written_rv:
        if target.existing is None:
            done.append(f"ConfigMap {target.configmap} (created by this run) left in place, unused")
        else:
            now = kube.get_configmap(settings.namespace, target.configmap)
            if now is not None and str(now["metadata"].get("resourceVersion")) == target.written_rv:
                previous = dict(now)
                previous["data"] = dict(target.existing.get("data") or {})
                kube.replace_configmap(previous)
                done.append(f"ConfigMap {target.configmap} restored to its previous content")
            else:
                done.append(f"ConfigMap {target.configmap} changed by someone else since; left as it is")
    return "; ".join(done)
