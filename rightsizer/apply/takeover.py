"""Which nodes a run settles before it starts anything new (pure): in-flight work belongs to the
cluster, not to the run that started it.

Every MIG node left at ``cordoned``, ``drained`` or ``relabeled`` by any run (a killed ``apply``, a
``serve`` replica that died, another plan) is either finished — when this plan moves it from the same
config to the same target — or rolled back; then come the plan's other nodes this run may start.
The apply Lease guarantees that no live run is working on those nodes.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from rightsizer.apply import protocol as proto
from rightsizer.plan.model import NodePlan, Plan


@dataclass(frozen=True)
class Settlement:
    finish: tuple[NodePlan, ...]
    """In-flight nodes this plan finishes (first, in name order)."""
    roll_back: tuple[tuple[proto.NodeView, str], ...]
    """In-flight nodes it rolls back, each with the reason."""
    fresh: tuple[NodePlan, ...]
    """Then the plan's other changed nodes this run may start, in the plan's order."""


def settle(nodes: Iterable[proto.NodeView], plan: Plan, *, only: Collection[str] | None) -> Settlement:
    """``nodes``: the cluster's MIG nodes; ``only``: the changed nodes this run may start (None: all)."""
    changed = {n.name: n for n in plan.changed_nodes}
    finish: list[NodePlan] = []
    roll_back: list[tuple[proto.NodeView, str]] = []
    for node in sorted((n for n in nodes if n.in_flight), key=lambda n: n.name):
        pn = changed.get(node.name)
        decision = proto.orphan_decision(
            node,
            current=pn.current_config_name if pn is not None else None,
            target=pn.config_name if pn is not None else None,
        )
        if decision.action == "resume" and pn is not None:
            finish.append(pn)
        else:
            roll_back.append((node, decision.reason))
    settled = {n.name for n in finish} | {node.name for node, _ in roll_back}
    fresh = tuple(n for n in plan.changed_nodes if n.name not in settled and (only is None or n.name in only))
    return Settlement(tuple(finish), tuple(roll_back), fresh)
