"""The guarded auto-apply's choice of nodes, from the cluster and the ledger (pure functions).

``max_nodes_per_day`` counts nodes *disrupted* (cordoned for a MIG change) on the local day, read
from the nodes' ``gpupilot.io/cordoned-at`` annotations and the ledger's day list together, so no
pattern of failures (a replica killed after its cordon, an apply that never reported) lets a day
disrupt more nodes than the budget. Nodes another run left in flight are settled by the next apply
before anything new starts; they were counted on the day they were cordoned.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date
from zoneinfo import ZoneInfo

from rightsizer.apply import protocol as proto
from rightsizer.apply.applier import ApplyReport
from rightsizer.plan.model import Plan
from rightsizer.serve.ledger import Entries

DISRUPTED = frozenset({"applied", "rolled-back", "rollback-failed", "stopped", "orphan-rolled-back"})
"""Outcomes of a node that was cordoned for the change (``failed``: nothing changed on it)."""
UNFINISHED = frozenset({"not-started", "stopped"})
"""Outcomes after which the node is not done with: a later round (or replica) takes it up."""


@dataclass(frozen=True)
class ClusterMarks:
    """What the nodes say about runs: in flight now, and cordoned on the day in question."""

    in_flight: frozenset[str]
    cordoned_today: frozenset[str]

    @classmethod
    def read(cls, nodes: Iterable[proto.NodeView], *, day: date, tz: ZoneInfo) -> ClusterMarks:
        in_flight, today = set(), set()
        for node in nodes:
            stamp = proto.cordoned_at(node)
            if node.in_flight:
                in_flight.add(node.name)
                if stamp is None:  # an older run's cordon without a stamp: counted now, to be safe
                    today.add(node.name)
            if stamp is not None and stamp.astimezone(tz).date() == day:
                today.add(node.name)
        return cls(frozenset(in_flight), frozenset(today))


@dataclass(frozen=True)
class Choice:
    """One round's work: the new nodes to start (in order) and what the budget says."""

    new: tuple[str, ...]
    in_flight: frozenset[str]
    disrupted_today: frozenset[str]
    left: int

    @property
    def idle(self) -> bool:
        return not self.new and not self.in_flight


def choose(plan: Plan, entries: Entries, marks: ClusterMarks, *, day: str, per_day: int) -> Choice:
    """New nodes of ``plan`` within today's budget: most GPUs freed first, never one this plan
    already tried, one in flight (the apply settles those first) or one disrupted today."""
    disrupted = frozenset(entries.day(day) | marks.cordoned_today)
    left = max(0, per_day - len(disrupted))
    skip = entries.tried_in(plan.plan_id) | marks.in_flight | disrupted
    order = sorted(plan.changed_nodes, key=lambda n: (-n.gpus_freed, n.name))
    fresh = tuple(n.name for n in order if n.name not in skip)
    return Choice(fresh[:left], marks.in_flight, disrupted, left)


def idle_reason(plan: Plan, choice: Choice, *, per_day: int) -> str:
    """Why a round with nothing to do does nothing."""
    if choice.left <= 0:
        return f"max_nodes_per_day={per_day} reached ({', '.join(sorted(choice.disrupted_today))} today)"
    return f"every node of plan {plan.plan_id} was already tried or applied"


def record(entries: Entries, report: ApplyReport, *, plan_id: str, day: str) -> None:
    """Fold an apply's outcomes into the ledger: the day's disrupted nodes, the plan's tried nodes,
    and ``started`` (of any plan) left with the nodes the apply did not settle."""
    entries.prune(plan_id=plan_id, today=date.fromisoformat(day))
    entries.add_day(day, {o.node for o in report.outcomes if o.result in DISRUPTED})
    finished = {o.node for o in report.outcomes if o.result not in UNFINISHED}
    entries.add_tried(plan_id, finished)
    for handed_by, nodes in list(entries.started.items()):  # whichever run handed them over
        entries.set_started(handed_by, set(nodes) - finished)
