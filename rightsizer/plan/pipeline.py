"""Prometheus → plan in one call (analysis, optimiser, plan building): the one pipeline ``plan``,
``report`` and ``serve`` share, with the user's settings typed in :class:`PlanSettings`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from gpupilot_common.timefmt import format_time
from rightsizer.analysis import history as analysis
from rightsizer.analysis import lookback, pending
from rightsizer.clients.prometheus import PrometheusClient
from rightsizer.errors import RightsizerError
from rightsizer.migparted.config import MigPartedConfig
from rightsizer.optimise import fleet as optimiser
from rightsizer.plan import build as planning
from rightsizer.plan import clusters, dra, nodelabels
from rightsizer.plan.model import Plan
from rightsizer.plan.settings import PlanSettings, window_text


class NoInventoryError(RightsizerError, RuntimeError):
    """Prometheus has no ``gpupilot_gpu_info`` at the end of the window: nothing to plan."""


class UnknownClusterError(RightsizerError, LookupError):
    """``--cluster NAME`` names no cluster of the inventory."""


def make_plan(
    client: PrometheusClient,
    *,
    end: float,
    settings: PlanSettings,
    progress: Callable[[str], None] = lambda _m: None,
    cluster_configs: Sequence[MigPartedConfig] = (),
    node_modes: Mapping[str, tuple[str, str]] | None = None,
    node_labels: Mapping[str, Mapping[str, str]] | None = None,
) -> Plan:
    """Analyse the window ending at ``end``, optimise, build the plan; :class:`NoInventoryError` when
    the exporter's inventory is missing at ``end``. ``cluster_configs``: the cluster's mig-parted
    configs, whose names a proposed layout equal to one of them reuses (``plan --mig-config``).

    Several clusters (series labelled ``settings.cluster_label``): each is optimised and planned on its
    own, exactly as if its history were alone, and the plans merged (:mod:`rightsizer.plan.clusters`);
    ``settings.cluster`` keeps one (:class:`UnknownClusterError` when the inventory has no such cluster).
    ``node_modes``: node name → (mode, reason) as the Kubernetes API shows it
    (:func:`rightsizer.plan.management.mode`), for the nodes of ``settings.cluster`` (else of every
    cluster): a DynamicMIG node there leaves the plan even when its series do not show it.
    ``node_labels``: node name → labels as the Kubernetes API shows them, for the same nodes: the MIG
    strategy and config come from there rather than from kube-state-metrics' ``kube_node_labels``
    (:mod:`rightsizer.plan.nodelabels`); a MIG node neither shows a strategy for is planned as
    ``mixed`` with a note saying so."""
    result = analysis.analyse(client, end=end, settings=settings.analysis_settings(), progress=progress)
    if not result.nodes:
        raise NoInventoryError(
            f"no gpupilot_gpu_info series at {format_time(end)} in {client.url}; is the exporter scraped? "
            "(use --at for history that ended earlier)"
        )
    result = replace(
        result, pending=pending.read_pending(client, at=end, cluster_label=settings.cluster_label)
    )
    if node_labels:
        result = nodelabels.from_api(result, node_labels, cluster=settings.cluster)
    result = nodelabels.with_note(result, nodelabels.unknown_strategy_note(result))
    if settings.looks_back:
        progress(f"reading busy hours up to {window_text(settings.lookback_s)} back (--lookback)")
        result, note = lookback.attach(
            client,
            result,
            settings=lookback.LookbackSettings(
                lookback_s=settings.lookback_s,
                idle_threshold=settings.idle_threshold,
                headroom=settings.headroom,
                cluster_label=settings.cluster_label,
            ),
        )
        if note:
            result = replace(result, notes=(*result.notes, note))
    names = result.clusters
    if settings.cluster is not None:
        if settings.cluster not in names:
            known = ", ".join(clusters.shown(c) for c in names)
            raise UnknownClusterError(
                f"--cluster {settings.cluster!r}: no such {settings.cluster_label} label value in the "
                f"inventory at {format_time(end)} (clusters: {known})"
            )
        names = (settings.cluster,)
    # DRA nodes whose MIG devices are created per claim are never relabelled (the MIG Manager must
    # not run there): they leave the analysis, and their workloads get claim-template advice.
    advice = dra.detect(
        client,
        result,
        end=end,
        window_s=settings.window_s,
        headroom=settings.headroom,
        cluster_label=settings.cluster_label,
        cluster_modes={
            (n.cluster, n.name): node_modes[n.name]
            for n in result.nodes
            if node_modes and n.name in node_modes and settings.cluster in (None, n.cluster)
        },
    )
    result = dra.without_nodes(result, advice.dynamic_nodes)
    parts = []
    for name in names:
        part = result.for_cluster(name)
        where = f" in cluster {clusters.shown(name)}" if name else ""
        progress(f"optimising {len(part.nodes)} node(s), {len(part.devices)} device(s){where}")
        fleet = optimiser.optimise(part, settings=settings.optimiser)
        parts.append(
            planning.build_plan(
                part,
                fleet,
                context=planning.PlanContext(
                    window=settings.window_text,
                    settings=settings.record(),
                    cluster_configs=cluster_configs,
                    cluster_label=settings.cluster_label,
                ),
            )
        )
    plan = clusters.merge(parts)
    return replace(plan, dra=dra.to_dict(advice)) if advice.nodes else plan
