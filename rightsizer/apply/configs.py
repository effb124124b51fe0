"""Step 1 of ``apply``: the mig-parted ConfigMap (merged, never dropping configs) and the ClusterPolicy."""

from __future__ import annotations

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
    cfg = ((policy.get("spec") or {}).get("migManager") or {}).get("config") or {}
    pointed = str(cfg.get("name") or mig_configmap.OPERATOR_DEFAULT_CONFIGMAP)
    target = settings.configmap or (
        pointed if pointed != mig_configmap.OPERATOR_DEFAULT_CONFIGMAP else mig_configmap.GPUPILOT_CONFIGMAP
    )
    try:
        existing = kube.get_configmap(settings.namespace, target)
        sources = []
        if pointed != target:
            sources.append(mig_configmap.configs_of(kube.get_configmap(settings.namespace, pointed)))
        sources.append(mig_configmap.configs_of(existing))
    except mig_configmap.ConfigMapError as exc:
        raise ApplyError(str(exc)) from exc
    merged = mig_configmap.merge(existing=sources, wanted=mig_configmap.plan_configs(plan))
    changed = existing is None or mig_configmap.configs_of(existing) != merged.configs
    return ConfigTarget(target, policy["metadata"]["name"], pointed != target, merged, existing, changed)


def write_configs(kube: Kube, plan: Plan, settings: ApplySettings, *, progress: Progress) -> ConfigTarget:
    """Step 1: merge the plan's configs into the ConfigMap and point the ClusterPolicy at it (409s retried)."""
    for _ in range(settings.conflict_retries):
        target = resolve_config_target(kube, plan, settings)
        try:
            if target.changed:
                data = {mig_configmap.DATA_KEY: target.merge.render()}
                if target.existing is None:
                    kube.create_configmap(settings.namespace, target.configmap, data)
                else:
                    updated = dict(target.existing)
                    updated["data"] = {**(target.existing.get("data") or {}), **data}
                    kube.replace_configmap(updated)
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
                kube.patch_cluster_policy(
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
            return target
        except ConflictError as exc:
            log.info("conflict writing configs, retrying: %s", exc)
    raise ApplyError(
        f"ConfigMap {target.configmap}: kept conflicting after {settings.conflict_retries} tries"
    )
