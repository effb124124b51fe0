"""Node labels the plan needs (``nvidia.com/mig.strategy``, ``nvidia.com/mig.config``), from the
Kubernetes API where the rightsizer has it, else from kube-state-metrics' ``kube_node_labels``.

kube-state-metrics >= 2.0 exports a node label in ``kube_node_labels`` only when it is allow-listed
(``--metric-labels-allowlist=nodes=[nvidia.com/mig.config,nvidia.com/mig.config.state,
nvidia.com/mig.strategy]``). Without either source a MIG node's strategy is unknown: the plan then
treats it as ``mixed`` (the GPU Operator's default) and says so in a note, instead of silently."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from rightsizer.analysis.types import Analysis

STRATEGY = "nvidia.com/mig.strategy"
CONFIG = "nvidia.com/mig.config"
ALLOWLIST = "nodes=[nvidia.com/mig.config,nvidia.com/mig.config.state,nvidia.com/mig.strategy]"
"""kube-state-metrics' --metric-labels-allowlist entry for the node labels gpupilot reads."""


def from_api(
    result: Analysis, labels: Mapping[str, Mapping[str, str]], *, cluster: str | None = None
) -> Analysis:
    """``result`` with each node's strategy and MIG config taken from ``labels`` (node name → its
    labels as the API shows them) for the nodes of ``cluster`` (None: every node); nodes the API
    does not list keep what the series said."""
    nodes = []
    for n in result.nodes:
        own = labels.get(n.name) if cluster in (None, n.cluster) else None
        if own is None:
            nodes.append(n)
            continue
        strategy = own.get(STRATEGY, "")
        nodes.append(
            replace(
                n,
                mig_strategy=strategy or n.mig_strategy,
                mig_strategy_known=bool(strategy) or n.mig_strategy_known,
                mig_config=own.get(CONFIG, "") or n.mig_config,
            )
        )
    return replace(result, nodes=tuple(nodes))


def unknown_strategy_note(result: Analysis) -> str:
    """A note naming the MIG nodes whose strategy neither source gave ("" when there are none)."""
    unknown = sorted(
        n.name for n in result.nodes if not n.mig_strategy_known and any(g.mig_enabled for g in n.gpus)
    )
    if not unknown:
        return ""
    shown = ", ".join(unknown[:5]) + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
    return (
        f"{len(unknown)} MIG node(s) without the {STRATEGY} label ({shown}): planned as mixed. "
        f"kube_node_labels carries node labels only when kube-state-metrics allow-lists them "
        f"(--metric-labels-allowlist={ALLOWLIST}); or give the rightsizer the Kubernetes API "
        "(plan --kubeconfig; serve reads it in the cluster)"
    )


def with_note(result: Analysis, note: str) -> Analysis:
    """``result`` with ``note`` added to its notes (and to each cluster's own)."""
    if not note:
        return result
    return replace(
        result,
        notes=(*result.notes, note),
        cluster_notes={c: (*own, note) for c, own in result.cluster_notes.items()},
    )
