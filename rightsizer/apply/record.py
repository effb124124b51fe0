"""The in-flight record: the nodes a run has in flight and the workloads it changed, kept where no
node can write.

A node's ``gpupilot.io/`` annotations say where its change stands, for people and for the next run,
but whoever holds a node's kubelet credentials may rewrite them (NodeRestriction limits what a
kubelet writes in its Node's labels, not its annotations). So they are never the authority for what
``apply`` does: the run holding the apply Lease keeps a record of its own, a ConfigMap
(:data:`CONFIGMAP`) in the Lease's namespace, and reads the nodes through it
(:func:`trusted_view`):

- before the cordon it records the node (its UID, the plan, the config before and after, whether it
  was cordoned already) and the workloads the change disrupts: the pods it found on the node and the
  request moves their templates get (:class:`rightsizer.apply.workloads.Change`);
- after each step it records the step; once the node is done or rolled back the record goes.

A node is in flight only while the record holds it, whatever its annotations say (an in-flight step
on a node the record does not hold is set aside, and said once); where the record holds it, its
plan, configs and workloads are the record's. The one thing taken from the node is how far its own
change went, and only when its annotations name the recorded plan. A workload template is changed
only when the record names it and its ``gpupilot.io/requests-changed-by`` mark agrees
(:mod:`rightsizer.apply.workload_steps`).

A record that cannot be read stops the run in one line: losing it would lose what is in flight.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from rightsizer.apply import protocol as proto
from rightsizer.apply import workloads as wl
from rightsizer.apply.settings import ApplyError
from rightsizer.clients.kube import ConflictError, Kube

CONFIGMAP = "gpupilot-rightsizer-in-flight"
"""The record's ConfigMap, in the apply Lease's namespace (the GPU Operator's)."""
DATA_KEY = "in-flight.json"
FORMAT = 1
CONFLICT_RETRIES = 8
"""A 409 on the record (someone wrote it meanwhile) is answered by re-reading it this often."""


@dataclass(frozen=True)
class Record:
    """One node in flight, as the run that cordoned it recorded it."""

    node: str
    uid: str
    """The Node object's UID: a node deleted and made again under the same name is another node."""
    plan_id: str
    previous: str
    target: str
    was_unschedulable: bool
    step: str
    """The last step done (:class:`rightsizer.apply.protocol.Step`; ``starting``: recorded, the
    cordon not yet confirmed)."""
    mode: str = ""
    """``patch`` or ``gitops`` (how the workloads get their request); "" when none moves."""
    changes: tuple[wl.Change, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "uid": self.uid,
            "plan": self.plan_id,
            "previous": self.previous,
            "target": self.target,
            "wasUnschedulable": self.was_unschedulable,
            "step": self.step,
            "mode": self.mode,
            "workloads": [c.to_json() for c in self.changes],
        }

    @classmethod
    def from_json(cls, node: str, doc: Mapping[str, Any]) -> Record:
        step = str(doc["step"])
        proto.Step(step)  # ValueError for a step the protocol does not know
        return cls(
            node=node,
            uid=str(doc["uid"]),
            plan_id=str(doc["plan"]),
            previous=str(doc["previous"]),
            target=str(doc["target"]),
            was_unschedulable=bool(doc["wasUnschedulable"]),
            step=step,
            mode=str(doc.get("mode") or ""),
            changes=tuple(wl.Change.from_json(c) for c in doc.get("workloads") or []),
        )


class RecordUnreadable(ApplyError):
    """The record's ConfigMap holds something this version cannot read: nothing is touched."""


def decode(text: str, *, where: str) -> dict[str, Record]:
    """The records a ConfigMap's text holds; :class:`RecordUnreadable` naming ``where`` otherwise."""
    try:
        doc = json.loads(text)
        if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("nodes"), dict):
            raise ValueError(f"not a format-{FORMAT} record")
        return {str(name): Record.from_json(str(name), entry) for name, entry in doc["nodes"].items()}
    except (ValueError, KeyError, TypeError, IndexError, AttributeError, RecursionError) as exc:
        raise RecordUnreadable(
            f"{where}: key {DATA_KEY} cannot be read ({type(exc).__name__}: {str(exc)[:200]}); it records "
            "the nodes apply has in flight: restore it, or delete it once no node is in flight"
        ) from None


def encode(records: Mapping[str, Record]) -> str:
    nodes = {name: records[name].to_json() for name in sorted(records)}
    return json.dumps({"format": FORMAT, "nodes": nodes}, separators=(",", ":"), sort_keys=True)


class InFlightRecord:
    """The record in the cluster (:data:`CONFIGMAP` in ``namespace``), read once per run and written
    through on every change (thread-safe: the nodes of a batch are applied in threads)."""

    def __init__(self, kube: Kube, namespace: str, *, name: str = CONFIGMAP) -> None:
        self.kube, self.namespace, self.name = kube, namespace, name
        self._lock = threading.Lock()
        self._seen: dict[str, Any] | None = None
        self._records: dict[str, Record] = {}

    @property
    def where(self) -> str:
        return f"ConfigMap {self.namespace}/{self.name}"

    def load(self) -> dict[str, Record]:
        """Read the record from the cluster (raises :class:`RecordUnreadable`, or a KubeError)."""
        with self._lock:
            self._read()
            return dict(self._records)

    def get(self, node: str) -> Record | None:
        with self._lock:
            return self._records.get(node)

    def all(self) -> dict[str, Record]:
        with self._lock:
            return dict(self._records)

    def put(self, record: Record) -> None:
        self._write(lambda records: {**records, record.node: record})

    def set_step(self, node: str, step: proto.Step) -> None:
        def change(records: dict[str, Record]) -> dict[str, Record]:
            found = records.get(node)
            return records if found is None else {**records, node: replace(found, step=str(step))}

        self._write(change)

    def drop(self, node: str) -> None:
        self._write(lambda records: {k: v for k, v in records.items() if k != node})

    def _read(self) -> None:
        cm = self.kube.get_configmap(self.namespace, self.name)
        self._seen = cm
        data = (cm or {}).get("data") or {}
        text = data.get(DATA_KEY) if isinstance(data, dict) else None
        self._records = decode(str(text), where=self.where) if text else {}

    def _write(self, change: Callable[[dict[str, Record]], dict[str, Record]]) -> None:
        with self._lock:
            for _ in range(CONFLICT_RETRIES):
                after = change(dict(self._records))
                if after == self._records and self._seen is not None:
                    return
                data = {DATA_KEY: encode(after)}
                try:
                    if self._seen is None:
                        self._seen = self.kube.create_configmap(self.namespace, self.name, data)
                    else:
                        self._seen = self.kube.replace_configmap({**self._seen, "data": data})
                except ConflictError:  # written meanwhile (or created): read it again, change it again
                    self._read()
                    continue
                self._records = after
                return
        raise ApplyError(f"{self.where} kept changing while apply wrote it ({CONFLICT_RETRIES} tries)")


def trusted_view(node: proto.NodeView, record: Record | None) -> proto.NodeView:
    """``node`` as the record says: the record's plan, configs, cordon state and workloads where it
    holds the node (how far the change went from the node, when its annotations name the recorded
    plan; else the record's last step), and no in-flight step where it does not."""
    raw = dict(node.annotations)
    if record is None or record.uid != node.uid:
        if node.step in proto.IN_FLIGHT:
            for key in (proto.ANN_STEP, wl.ANN_WORKLOADS, wl.ANN_WORKLOAD_MODE):
                raw.pop(key, None)
        return replace(node, annotations=raw)
    step = record.step
    if node.plan_id == record.plan_id and node.step in proto.IN_FLIGHT:
        order = list(proto.IN_FLIGHT)
        if order.index(proto.Step(node.step)) > order.index(proto.Step(record.step)):
            step = node.step  # the node's patch landed, the record's write did not (a killed run)
    raw.update(
        {
            proto.ANN_PLAN: record.plan_id,
            proto.ANN_PREVIOUS: record.previous,
            proto.ANN_TARGET: record.target,
            proto.ANN_WAS_UNSCHEDULABLE: str(record.was_unschedulable).lower(),
            proto.ANN_STEP: step,
        }
    )
    raw.pop(wl.ANN_WORKLOADS, None)
    raw.pop(wl.ANN_WORKLOAD_MODE, None)
    if record.changes:
        raw[wl.ANN_WORKLOADS] = wl.encode(record.changes)
        raw[wl.ANN_WORKLOAD_MODE] = record.mode
    return replace(node, annotations=raw)


def unrecorded(node: proto.NodeView, record: Record | None) -> str:
    """Why ``node``'s in-flight annotations are set aside ("" when they are not)."""
    if not node.in_flight:
        return ""
    if record is None:
        return (
            f"its annotations say plan {node.plan_id or '(unknown)'} left it at step {node.step}, but "
            "the in-flight record holds no such node: set aside (the record, not the node, says what "
            "apply has in flight)"
        )
    if record.uid != node.uid:
        return "the in-flight record holds another node of this name (a different UID): set aside"
    return ""


def mig_nodes(kube: Kube, namespace: str) -> list[proto.NodeView]:
    """The MIG nodes as the in-flight record in ``namespace`` shows them (what ``serve`` counts)."""
    records = InFlightRecord(kube, namespace).load()
    return [
        trusted_view(view, records.get(view.name))
        for view in (proto.view(n) for n in kube.list_nodes(label_selector=proto.CONFIG_LABEL))
    ]
