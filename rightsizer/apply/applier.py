"""Apply a plan through the NVIDIA MIG Manager's label protocol, one guarded node at a time.

1. Merge the plan's configs into the mig-parted ConfigMap (never dropping others') and point the
   ClusterPolicy's ``spec.migManager.config.name`` at it when it points elsewhere.
2. Per node, in batches of ``max_parallel``: cordon → evict the GPU pods the change disrupts
   (:func:`rightsizer.plan.disruption.evictions`: the plan's ``pods_disrupted`` and GPU pods it did not
   see; pods on GPUs that keep their layout keep running) through the Eviction API (
   PodDisruptionBudgets respected, retried on 429 until ``eviction_timeout_s``) → relabel
   ``nvidia.com/mig.config`` → watch ``nvidia.com/mig.config.state`` through pending/rebooting to success
   → on a node NVIDIA's DRA driver serves, restart its kubelet plugin and wait for its ResourceSlices to
   show the new MIG instances (:mod:`rightsizer.apply.draplugin`).
3. On ``failed`` or a timeout: restore the previous label, uncordon, record a Warning Event, and start no
   further batch. On success: uncordon (unless it was cordoned before we came) and a Normal Event.
   Around these steps (:mod:`rightsizer.apply.workload_steps`): before any change, the workloads of the
   pods to evict are found and their new GPU requests checked to fit (else the node is refused); after
   the cordon their pod templates get the new request (``--workloads patch``) or apply waits for Git
   to change them (``gitops``); after ``success`` the node is ``done`` only once every disrupted
   workload has its desired replicas Running and Ready with the new request (``settle_timeout_s``),
   else it is rolled back, templates included.
4. Steps are shown on the node (:mod:`rightsizer.apply.protocol`) and kept in the in-flight record
   (:mod:`rightsizer.apply.record`), where nodes cannot write, so a rerun resumes or skips. Before
   any new node, every node the record holds in flight (a killed ``apply``, a ``serve`` replica that
   died) is finished when this plan moves it to the same config, else rolled back; a node whose
   annotations alone say it is in flight is set aside.
5. Transient API errors (429 with ``Retry-After``, 5xx, dropped connections) are retried with backoff
   (:mod:`rightsizer.apply.retry`) within the node's deadline; a rollback that still fails is reported
   as ``rollback-failed`` (never ``rolled-back``), the node's annotations left for a rerun to resume.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import time
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from gpupilot_common.timefmt import format_time
from rightsizer.apply import draplugin, gitops, takeover
from rightsizer.apply import protocol as proto
from rightsizer.apply import record as inflight
from rightsizer.apply import workloads as wl
from rightsizer.apply.configs import resolve_config_target, restore_configs, write_configs
from rightsizer.apply.lease import ApplyLease
from rightsizer.apply.plancheck import check_plan
from rightsizer.apply.retry import Clock, Retrier
from rightsizer.apply.settings import ApplyError, ApplySettings, seconds_text
from rightsizer.apply.settle import WorkloadState
from rightsizer.apply.workload_steps import WorkloadsNotReady, WorkloadSteps
from rightsizer.clients.kube import (
    ConflictError,
    Kube,
    KubeError,
    MultipleBudgetsError,
    NotFoundError,
    PermanentKubeError,
    TooManyRequestsError,
)
from rightsizer.errors import RightsizerError
from rightsizer.migparted import nodeprofiles
from rightsizer.migparted.config import MigPartedError
from rightsizer.plan.disruption import evictions
from rightsizer.plan.model import NodePlan, Plan

log = logging.getLogger(__name__)

__all__ = ["Applier", "ApplyError", "ApplyReport", "ApplySettings", "NodeOutcome", "write_configs"]


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


@dataclass(frozen=True)
class NodeOutcome:
    node: str
    result: str
    """applied | already-applied | skipped | failed | rolled-back | rollback-failed | not-started |
    stopped (left at a recorded step for the next run) | orphan-rolled-back (another run's in-flight
    work this plan does not finish, undone)"""
    reason: str = ""
    previous: str = ""
    target: str = ""
    seconds: float = 0.0
    gpus_freed: int = 0
    workloads: tuple[WorkloadState, ...] = ()
    """The disrupted workloads: request change and pods Running/desired when the node ended."""


@dataclass(frozen=True)
class ApplyReport:
    plan_id: str
    configmap: str
    configmap_changed: bool
    cluster_policy_patched: bool
    outcomes: tuple[NodeOutcome, ...] = field(default_factory=tuple)
    configs_restored: str = ""
    """What step 1's undo did after a run in which no node took the new configs ("" if not run)."""

    @property
    def failed(self) -> tuple[NodeOutcome, ...]:
        return tuple(o for o in self.outcomes if o.result in FAILED)

    @property
    def applied(self) -> tuple[NodeOutcome, ...]:
        return tuple(o for o in self.outcomes if o.result == "applied")

    @property
    def ok(self) -> bool:
        return not self.failed

    @property
    def interrupted(self) -> bool:
        """The run stopped before every node was dealt with (its Lease lost, told to stop, or after a
        failure): ``stopped`` nodes wait at a recorded step for the next run."""
        return any(o.result in ("stopped", "not-started") for o in self.outcomes)


FAILED = ("failed", "rolled-back", "rollback-failed")
"""Results that stop later batches: nothing changed (``failed``), undone, or left half-done."""


class NodeFailure(RightsizerError):
    """The node cannot be reconfigured now; it is rolled back with this reason."""


class _Stop(Exception):
    """A node that ends before any change: ``result`` and ``reason`` of its outcome."""

    def __init__(self, result: str, reason: str) -> None:
        super().__init__(reason)
        self.result, self.reason = result, reason


class _Handover(Exception):
    """The run must stop (lost leadership or Lease) and the node is at a recorded step."""


class NodeSkip(RightsizerError):
    """The node is not ours to touch (changed since the plan, another plan in flight)."""


Progress = Callable[[str, str], None]
"""``progress(node, message)``: called after every persisted step (the CLI prints it on stderr)."""


def _now() -> str:
    return format_time(dt.datetime.now(dt.UTC))


class Applier:
    def __init__(
        self,
        kube: Kube,
        plan: Plan,
        settings: ApplySettings,
        *,
        progress: Progress | None = None,
        clock: Clock | None = None,
        only: Collection[str] | None = None,
        stop: Callable[[], str] | None = None,
        on_lease_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        """``only``: the changed nodes this run may start (None: all; in-flight nodes are settled
        whatever it says); ``stop``: why the run must stop now ("" to go on), asked at each safe step
        (before a cordon and between recorded steps, never inside an eviction batch)."""
        self.kube, self.plan, self.settings = kube, plan, settings
        self.progress: Progress = progress or (lambda node, msg: log.info("%s: %s", node, msg))
        self.clock: Clock = clock or SystemClock()
        self.only = None if only is None else frozenset(only)
        self._stop = stop or (lambda: "")
        self._on_lease_failure = on_lease_failure
        self._lease: ApplyLease | None = None
        self.record = inflight.InFlightRecord(kube, settings.namespace)
        self.workload_steps = WorkloadSteps(
            kube, settings, plan_id=plan.plan_id, clock=self.clock, progress=self._say
        )

    def _say(self, node: str, message: str) -> None:
        self.progress(node, message)

    # -- the whole run --------------------------------------------------------------------------
    def run(self) -> ApplyReport:
        check_plan(self.plan)  # before touching anything
        r = self._retrier("-", self.clock.monotonic() + self.settings.api_retry_s)
        # the ClusterPolicy, namespace and ConfigMap checks too (read-only), before even the Lease
        r.call("read the ClusterPolicy", lambda: resolve_config_target(self.kube, self.plan, self.settings))
        if self.settings.lease_duration_s <= 0:
            return self._run(None)
        lease = ApplyLease(
            self.kube,
            self.settings.namespace,
            duration_s=self.settings.lease_duration_s,
            on_failure=self._on_lease_failure,
        )
        r.call(
            "take the apply Lease",
            lambda: lease.acquire(
                monotonic=self.clock.monotonic, sleep=self.clock.sleep, progress=self.progress
            ),
        )
        self._lease = lease
        self.progress("-", f"holding Lease {lease.namespace}/{lease.name} as {lease.identity}")
        try:
            return self._run(lease)
        finally:
            lease.stop_renewing()
            r = self._retrier("-", self.clock.monotonic() + self.settings.api_retry_s)
            try:
                r.call("give back the apply Lease", lease.give_back)
            except KubeError as exc:
                self.progress(
                    "-",
                    f"could not give back the apply Lease (it expires {lease.duration_s}s after now): {exc}",
                )

    def stop_reason(self) -> str:
        """Why this run must stop at its next safe step ("" : it goes on)."""
        if self._lease is not None and self._lease.lost.is_set():
            return "the loss of the apply Lease (another run took it)"
        if self._lease is not None and not self._lease.held():
            return "the apply Lease not renewed in time (the API did not answer)"
        return self._stop()

    def _run(self, lease: ApplyLease | None) -> ApplyReport:
        configs = self._retrier("-", self.clock.monotonic() + self.settings.api_retry_s)
        configs.call(f"read the in-flight record ({self.record.where})", self.record.load)
        target = configs.call(
            "write the MIG configs",
            lambda: write_configs(self.kube, self.plan, self.settings, progress=self.progress),
        )
        if (target.changed or target.repoint) and self.settings.configmap_sync_s > 0:
            self.progress(
                "-",
                f"waiting {seconds_text(self.settings.configmap_sync_s)} for the MIG Manager to see the ConfigMap",
            )
            self.clock.sleep(self.settings.configmap_sync_s)
        outcomes: list[NodeOutcome] = []
        settlement, settled = self._settle_in_flight()
        outcomes.extend(settled)
        size = max(1, self.settings.max_parallel)
        # the in-flight nodes this plan finishes have batches of their own: all settled before anything new
        batches = [
            group[i : i + size]
            for group in (settlement.finish, settlement.fresh)
            for i in range(0, len(group), size)
        ]
        stopped_by = next((f"the failure on {o.node}" for o in settled if o.result in FAILED), "")
        with ThreadPoolExecutor(max_workers=size, thread_name_prefix="apply") as pool:
            for batch in batches:
                if not stopped_by and (why := self.stop_reason()):
                    stopped_by = why
                if stopped_by:
                    outcomes.extend(
                        NodeOutcome(
                            n.name,
                            "not-started",
                            f"stopped after {stopped_by}",
                            n.current_config_name,
                            n.config_name,
                        )
                        for n in batch
                    )
                    continue
                results = list(pool.map(self.apply_node, batch))
                outcomes.extend(results)
                failed = [o.node for o in results if o.result in FAILED]
                if failed:
                    stopped_by = f"the failure on {', '.join(failed)}"
        restored = ""
        in_use = any(
            o.result in ("applied", "already-applied", "rollback-failed", "stopped") for o in outcomes
        )
        if stopped_by and not in_use and (target.written_rv or target.policy_rv):
            undo = self._retrier("-", self.clock.monotonic() + self.settings.api_retry_s)
            try:
                restored = undo.call(
                    "restore the MIG configs", lambda: restore_configs(self.kube, target, self.settings)
                )
            except KubeError as exc:
                restored = f"could not restore the ConfigMap/ClusterPolicy: {exc}"
            self.progress("-", restored)
        return ApplyReport(
            self.plan.plan_id, target.configmap, target.changed, target.repoint, tuple(outcomes), restored
        )

    def _settle_in_flight(self) -> tuple[takeover.Settlement, list[NodeOutcome]]:
        """Before anything new (:mod:`rightsizer.apply.takeover`): what to run (the in-flight nodes
        this plan finishes, then the new ones), after rolling back the in-flight ones it does not."""
        r = self._retrier("-", self.clock.monotonic() + self.settings.api_retry_s)
        listed = r.call(
            "list the MIG nodes",
            lambda: [proto.view(n) for n in self.kube.list_nodes(label_selector=proto.CONFIG_LABEL)],
        )
        rolled: list[NodeOutcome] = []
        found = []
        for raw in listed:
            record = self.record.get(raw.name)
            if note := inflight.unrecorded(raw, record):
                self.progress(raw.name, note)
            found.append(inflight.trusted_view(raw, record))
        for record in self.record.all().values():  # recorded, but not among the MIG nodes listed
            if record.node in {n.name for n in listed}:
                continue
            gone: proto.NodeView | None
            try:
                gone = proto.view(
                    r.call(f"read node {record.node}", functools.partial(self.kube.get_node, record.node))
                )
            except NotFoundError:
                gone = None
            if gone is not None and gone.uid == record.uid:
                found.append(inflight.trusted_view(gone, record))
                continue
            rolled.append(self._forget_gone(record, r))
        plan = takeover.settle(found, self.plan, only=self.only)
        for node, reason in plan.roll_back:
            self.progress(node.name, reason)
            problem = self._rollback(node.name, reason, current=node.previous)
            result, why = (
                ("rollback-failed", f"{reason}; {problem}") if problem else ("orphan-rolled-back", reason)
            )
            rolled.append(NodeOutcome(node.name, result, why, node.previous, node.target))
        return plan, rolled

    def _forget_gone(self, record: inflight.Record, r: Retrier) -> NodeOutcome:
        """A recorded node that is gone (or made again under its name): its workloads restored as
        the record says, then the record dropped."""
        reason = f"node gone since plan {record.plan_id} cordoned it; restoring its workloads"
        self.progress(record.node, reason)
        problem, note = self.workload_steps.restore(record.node, record, r)
        if note:
            self.progress(record.node, note)
        if not problem:
            try:
                r.call(f"forget {record.node} in the in-flight record", lambda: self.record.drop(record.node))
            except KubeError as exc:
                problem = f"could not update the in-flight record: {exc}"
        result = "rollback-failed" if problem else "orphan-rolled-back"
        why = f"{reason}; {problem}" if problem else reason
        return NodeOutcome(record.node, result, why, record.previous, record.target)

    def _view(self, obj: dict[str, Any]) -> proto.NodeView:
        """A node read from the API, as the in-flight record says (never its own annotations alone)."""
        raw = proto.view(obj)
        return inflight.trusted_view(raw, self.record.get(raw.name))

    def _node_objection(self, pn: NodePlan) -> str:
        """The node's own MIG Manager profile list (v26.3+) overrides the catalogue: a config naming a
        profile it does not offer would fail on the node, so the node is not touched.

        A Role that pins ConfigMaps by name (deploy/rightsizer) cannot name every node's list: a 403
        is said once per node and the config is checked against the catalogue only (plan checks)."""
        name = nodeprofiles.configmap_name(pn.name)
        try:
            cm = self.kube.get_configmap(self.settings.namespace, name)
        except PermanentKubeError as exc:
            if exc.status != 403:
                raise
            self.progress(
                pn.name,
                f"not allowed to read ConfigMap {self.settings.namespace}/{name} (HTTP 403): the config "
                "was checked against the geometry catalogue only",
            )
            return ""
        try:
            device_id = int(pn.pci_device_id, 16) or None
        except ValueError:
            device_id = None
        try:
            why = nodeprofiles.veto(
                cm, node=pn.name, device_id=device_id, config_name=pn.config_name, document=pn.config_document
            )
        except MigPartedError as exc:
            return f"its MIG Manager's ConfigMap cannot be read: {exc}"
        return f"{pn.config_name} is not offered by the node's MIG Manager: {why}" if why else ""

    # -- one node --------------------------------------------------------------------------------
    def _retrier(self, node: str, deadline: float) -> Retrier:
        return Retrier(
            self.clock,
            deadline,
            initial_s=max(self.settings.retry_interval_s, 0.01),
            max_s=self.settings.backoff_max_s,
            notify=lambda message: self.progress(node, message),
        )

    def apply_node(self, pn: NodePlan) -> NodeOutcome:
        started = self.clock.monotonic()
        s = self.settings
        r = self._retrier(pn.name, started + s.eviction_timeout_s + s.timeout_s + s.api_retry_s)
        states: tuple[WorkloadState, ...] = ()
        changes: tuple[wl.Change, ...] = ()

        def outcome(result: str, reason: str = "") -> NodeOutcome:
            return NodeOutcome(
                pn.name,
                result,
                reason,
                pn.current_config_name,
                pn.config_name,
                round(self.clock.monotonic() - started, 3),
                pn.gpus_freed if result == "applied" else 0,
                states,
            )

        try:
            node, step = self._preflight(pn, r)
            record = self._record_for(pn, node, step, r)
            changes = record.changes
        except _Stop as stop:
            return outcome(stop.result, stop.reason)
        try:
            if step is None:
                if why := self.stop_reason():
                    return outcome("not-started", f"stopped before the cordon by {why}")
                r.call(f"record {pn.name} in flight", lambda: self.record.put(record))
                step = proto.Step.STARTING
            node = self._forward(pn, record, step, node, r)
            states = self.workload_steps.settle(
                pn,
                changes,
                self._retrier(pn.name, self.clock.monotonic() + s.settle_timeout_s + s.api_retry_s),
            )
            node = self._patch(pn.name, proto.finish_patch, r)
            r.call(f"forget {pn.name} in the in-flight record", lambda: self.record.drop(pn.name))
            self._event(
                node,
                "MigReconfigured",
                f"gpupilot plan {self.plan.plan_id}: {node.previous} → {pn.config_name}",
                warning=False,
                retrier=r,
            )
            return outcome("applied")
        except NodeSkip as skip:
            self.progress(pn.name, f"skipped: {skip}")
            self._forget_unstarted(pn.name, r)
            return outcome("skipped", str(skip))
        except _Handover as stop:
            self.progress(pn.name, str(stop))
            return outcome("stopped", str(stop))
        except (NodeFailure, WorkloadsNotReady, KubeError) as exc:
            reason = str(exc)
            if self.record.get(pn.name) is None:  # the record is written before the cordon
                self.progress(pn.name, f"failed before any change: {reason}")
                return outcome("failed", f"nothing changed: {reason}")
            self.progress(pn.name, f"failed: {reason}; rolling back")
            problem = self._rollback(pn.name, reason, current=pn.current_config_name)
            states = self.workload_steps.observe(changes)
            if problem:
                return outcome("rollback-failed", f"{reason}; ROLLBACK FAILED: {problem}")
            return outcome("rolled-back", reason)

    def _record_for(
        self, pn: NodePlan, node: proto.NodeView, step: proto.Step | None, r: Retrier
    ) -> inflight.Record:
        """What the in-flight record holds for the node: a new record (its workloads prepared) for a
        node this run starts, the record itself for one it resumes (only the record resumes)."""
        if step is not None:
            found = self.record.get(pn.name)
            if found is None:  # cannot happen: a resume is decided from the record
                raise _Stop("skipped", "the in-flight record no longer holds it")
            return found
        changes = self._prepare_workloads(pn, r)
        return inflight.Record(
            node=pn.name,
            uid=node.uid,
            plan_id=self.plan.plan_id,
            previous=node.config,
            target=pn.config_name,
            was_unschedulable=node.unschedulable,
            step=str(proto.Step.STARTING),
            mode=self.settings.workloads if changes else "",
            changes=changes,
        )

    def _forward(
        self, pn: NodePlan, record: inflight.Record, step: proto.Step, node: proto.NodeView, r: Retrier
    ) -> proto.NodeView:
        """From ``step`` (the last one done) to ``settling``: each step shown on the node, then recorded."""
        s = self.settings
        if step == proto.Step.STARTING:
            node = self._patch(pn.name, lambda v: self._cordon(v, pn, record), r)
            self._recorded(pn.name, proto.Step.CORDONED, r)
            self.progress(pn.name, "cordoned")
            step = proto.Step.CORDONED
        if step == proto.Step.CORDONED:
            self._safe_point(step)
            wait_s = s.gitops_timeout_s if s.workloads == "gitops" else 0.0
            self.workload_steps.set_requests(
                pn,
                record.changes,
                self._retrier(pn.name, self.clock.monotonic() + wait_s + s.api_retry_s),
                plan_id=record.plan_id,
            )
            node = self._patch(pn.name, lambda v: proto.step_patch(v, proto.Step.REQUESTS_SET), r)
            self._recorded(pn.name, proto.Step.REQUESTS_SET, r)
            step = proto.Step.REQUESTS_SET
        if step == proto.Step.REQUESTS_SET:
            self._safe_point(step)
            self._drain(pn, r)
            node = self._patch(pn.name, lambda v: proto.step_patch(v, proto.Step.DRAINED), r)
            self._recorded(pn.name, proto.Step.DRAINED, r)
            self.progress(pn.name, "drained: no pod holds its GPUs")
            step = proto.Step.DRAINED
        if step == proto.Step.DRAINED:
            self._safe_point(step)
            node = self._patch(pn.name, lambda v: proto.relabel_patch(v, target=pn.config_name), r)
            self._recorded(pn.name, proto.Step.RELABELED, r)
            self.progress(pn.name, f"relabelled {proto.CONFIG_LABEL}={pn.config_name} (was {node.previous})")
            step = proto.Step.RELABELED
        if step == proto.Step.RELABELED:
            self._safe_point(proto.Step.RELABELED)
            node = self._wait_for_success(pn, node, r)
            self._restart_dra_plugin(pn, node, r)
            node = self._patch(pn.name, proto.settling_patch, r)
            self._recorded(pn.name, proto.Step.SETTLING, r)
            self.progress(
                pn.name,
                "success; uncordoned" if not node.was_unschedulable else "success; left cordoned as before",
            )
        return node

    def _forget_unstarted(self, name: str, r: Retrier) -> None:
        """A node recorded and then skipped before its cordon: out of the record again."""
        held = self.record.get(name)
        if held is None or held.step != proto.Step.STARTING:
            return
        try:
            r.call(f"forget {name} in the in-flight record", lambda: self.record.drop(name))
        except KubeError as exc:
            self.progress(name, f"could not update the in-flight record: {exc}")

    def _prepare_workloads(self, pn: NodePlan, r: Retrier) -> tuple[wl.Change, ...]:
        try:
            return self.workload_steps.prepare(pn, r)
        except wl.WorkloadRefused as exc:
            self.progress(pn.name, f"refused before any change: {exc}")
            raise _Stop("failed", f"nothing changed: {exc}") from exc
        except gitops.GitopsWriteFailed as exc:  # a read-only or full --gitops-dir, a link in the way
            self.progress(pn.name, f"failed before any change to the node: {exc}")
            raise _Stop("failed", f"node unchanged: {exc}; check --gitops-dir") from exc
        except KubeError as exc:
            self.progress(pn.name, f"failed before any change: {exc}")
            raise _Stop("failed", f"nothing changed: {exc}") from exc

    def _preflight(self, pn: NodePlan, r: Retrier) -> tuple[proto.NodeView, proto.Step | None]:
        """Read and judge the node before any change: (node, step to resume from); :class:`_Stop`
        with the result (skipped, failed, already-applied) when there is nothing to do."""
        try:
            node = self._view(r.call(f"read node {pn.name}", lambda: self.kube.get_node(pn.name)))
        except NotFoundError:
            self.progress(pn.name, "skipped: node not found")
            raise _Stop("skipped", "node not found") from None
        except KubeError as exc:
            self.progress(pn.name, f"failed before any change: {exc}")
            raise _Stop("failed", f"nothing changed: {exc}") from exc
        decision = proto.decide(
            node, plan_id=self.plan.plan_id, current=pn.current_config_name, target=pn.config_name
        )
        if decision.action == "skip":
            self.progress(pn.name, f"skipped: {decision.reason}")
            raise _Stop("skipped", decision.reason)
        if decision.action == "done":
            self.progress(pn.name, decision.reason)
            raise _Stop("already-applied", decision.reason)
        if decision.action == "rollback":  # in flight for another target since the settling: not ours
            self.progress(pn.name, f"skipped: {decision.reason}")
            raise _Stop("skipped", decision.reason)
        if decision.step is not None:
            self.progress(pn.name, decision.reason)
            return node, decision.step
        try:
            objection = r.call(
                f"read the MIG Manager profiles of {pn.name}", lambda: self._node_objection(pn)
            )
        except KubeError as exc:
            self.progress(pn.name, f"failed before any change: {exc}")
            raise _Stop("failed", f"nothing changed: {exc}") from exc
        if objection:
            self.progress(pn.name, f"skipped: {objection}")
            raise _Stop("skipped", objection)
        return node, None

    def _recorded(self, name: str, step: proto.Step, r: Retrier) -> None:
        """The step in the in-flight record, after the node's own patch (a node shown one step
        further than recorded, by the recorded plan, is resumed from there)."""
        r.call(f"record step {step} of {name}", lambda: self.record.set_step(name, step))

    def _safe_point(self, step: proto.Step) -> None:
        """Between two recorded steps: stop here when the run must stop (the next run resumes)."""
        if why := self.stop_reason():
            raise _Handover(f"stopped after step {step} by {why}; the next run resumes it")

    def _cordon(self, v: proto.NodeView, pn: NodePlan, record: inflight.Record) -> dict[str, Any]:
        """The cordon of a recorded node (``v`` as the record shows it), unless the node changed
        since it was recorded (:class:`NodeSkip`)."""
        if v.config != record.previous or v.state not in ("", "success"):
            raise NodeSkip(
                f"changed while starting: {proto.CONFIG_LABEL}={v.config or '(unset)'!r}, "
                f"{proto.STATE_LABEL}={v.state or '(unset)'!r}"
            )
        patch = proto.cordon_patch(
            v,
            plan_id=record.plan_id,
            target=record.target,
            now=_now(),
            previous=record.previous,
            was_unschedulable=record.was_unschedulable,
        )
        # shown before any template changes (the record holds them too), for people to read
        patch["metadata"]["annotations"].update(
            {
                wl.ANN_WORKLOADS: wl.encode(record.changes) if record.changes else None,
                wl.ANN_WORKLOAD_MODE: record.mode or None,
            }
        )
        return patch

    def _patch(
        self, name: str, build: Callable[[proto.NodeView], dict[str, Any]], r: Retrier
    ) -> proto.NodeView:
        """Read, build a guarded patch, write; on 409 re-read and rebuild; transient errors retried."""
        last: ConflictError | None = None
        for _ in range(self.settings.conflict_retries):
            current = self._view(r.call(f"read node {name}", lambda: self.kube.get_node(name)))
            patch = build(current)
            try:
                return self._view(
                    r.call(f"patch node {name}", functools.partial(self.kube.patch_node, name, patch))
                )
            except ConflictError as exc:
                last = exc
        raise NodeFailure(f"still conflicting after {self.settings.conflict_retries} tries: {last}")

    def _drain(self, pn: NodePlan, r: Retrier) -> None:
        """Evict the pods :func:`rightsizer.plan.disruption.evictions` names and wait for them to go."""
        node = pn.name
        deadline = self.clock.monotonic() + self.settings.eviction_timeout_s
        evicted: set[tuple[str, str, str]] = set()
        refused = ""
        while True:
            pods = r.call(f"list pods on {node}", lambda: self.kube.pods_on_node(node))
            gpu_pods = [p for p in pods if proto.holds_gpus(p)]
            chosen = {(e.namespace, e.name) for e in evictions(pn, (proto.pod_key(p)[:2] for p in gpu_pods))}
            holding = [p for p in gpu_pods if proto.pod_key(p)[:2] in chosen]
            if not holding:
                return
            for pod in holding:
                key = proto.pod_key(pod)
                if key in evicted or (pod.get("metadata") or {}).get("deletionTimestamp"):
                    continue
                ns, name = key[0], key[1]
                try:
                    r.call(
                        f"evict {ns}/{name}",
                        functools.partial(self.kube.evict_pod, ns, name),
                        retry_throttled=False,
                    )
                    evicted.add(key)
                    self.progress(node, f"evicted {key[0]}/{key[1]}")
                except TooManyRequestsError as exc:
                    refused = f"{key[0]}/{key[1]}: {exc}"
                except NotFoundError:
                    evicted.add(key)
                except MultipleBudgetsError as exc:
                    raise NodeFailure(
                        f"pod {key[0]}/{key[1]} is selected by more than one PodDisruptionBudget, and the "
                        "Eviction API refuses such pods (HTTP 500); make one budget cover it, or move it "
                        f"off {node}, then run apply again ({exc})"
                    ) from exc
            if self.clock.monotonic() >= deadline:
                names = ", ".join(
                    f"{p['metadata'].get('namespace')}/{p['metadata'].get('name')}" for p in holding
                )
                why = f" (last refusal {refused})" if refused else ""
                raise NodeFailure(
                    f"pods still hold the GPUs after {seconds_text(self.settings.eviction_timeout_s)}: {names}{why}"
                )
            self.clock.sleep(self.settings.retry_interval_s)

    def _wait_for_success(self, pn: NodePlan, node: proto.NodeView, r: Retrier) -> proto.NodeView:
        deadline = self.clock.monotonic() + self.settings.timeout_s
        seen = ""

        def read() -> proto.NodeView:
            return self._view(r.call(f"read node {pn.name}", lambda: self.kube.get_node(pn.name)))

        while True:
            if node.config != pn.config_name:
                raise NodeFailure(
                    f"{proto.CONFIG_LABEL} was changed to {node.config!r} by someone else while waiting"
                )
            if node.state != seen and node.state:
                seen = node.state
                self.progress(pn.name, f"{proto.STATE_LABEL}={seen}")
            if node.state == "success":
                return node
            if node.state == "failed":
                raise NodeFailure(
                    f"the MIG Manager reported {proto.STATE_LABEL}=failed for {pn.config_name} "
                    "(its pod log says why, e.g. 'In use by another client' or an unknown config name)"
                )
            remaining = deadline - self.clock.monotonic()
            if remaining <= 0:
                raise NodeFailure(
                    f"timed out after {seconds_text(self.settings.timeout_s)} waiting for {proto.STATE_LABEL}=success "
                    f"(last state {seen or 'none'})"
                )
            try:
                for obj in self.kube.watch_node(
                    pn.name, resource_version=node.resource_version, timeout_s=min(remaining, 30.0)
                ):
                    node = self._view(obj)
                    if (
                        node.state in ("success", "failed")
                        or node.config != pn.config_name
                        or node.state != seen
                    ):
                        break
                else:
                    node = read()
            except KubeError as exc:
                if exc.status in (401, 403):
                    raise
                log.info("%s: watch interrupted (%s); polling", pn.name, exc)
                self.clock.sleep(min(self.settings.retry_interval_s, max(0.0, remaining)))
                node = read()

    def _restart_dra_plugin(self, pn: NodePlan, node: proto.NodeView, r: Retrier) -> None:
        """On a node NVIDIA's DRA driver serves, its slices keep the old instances until its kubelet
        plugin restarts (:mod:`rightsizer.apply.draplugin`); a node without it is left as it is."""
        try:
            draplugin.restart(
                self.kube,
                node=pn.name,
                labels=node.labels,
                proposed=pn.proposed,
                retrier=r,
                clock=self.clock,
                timeout_s=self.settings.timeout_s,
                poll_s=max(self.settings.retry_interval_s, 0.01),
                progress=lambda message: self.progress(pn.name, message),
            )
        except draplugin.PluginNotReady as exc:
            raise NodeFailure(str(exc)) from exc

    def _rollback(self, name: str, reason: str, *, current: str) -> str:
        """Undo what a run did on node ``name`` (``current``: its config before); returns "" when
        done, else what is left and how to finish."""
        r = self._retrier(name, self.clock.monotonic() + self.settings.api_retry_s)
        record = self.record.get(name)
        templates, note = ("", "") if record is None else self.workload_steps.restore(name, record, r)
        if note:
            self.progress(name, note)
            reason = f"{reason}; {note}"
        try:
            if templates:
                raise NodeFailure(f"workload templates not restored: {templates}")
            node = self._patch(name, lambda v: proto.rollback_patch(v, reason=reason), r)
            if record is not None:
                r.call(f"forget {name} in the in-flight record", lambda: self.record.drop(name))
        except (NodeFailure, KubeError) as exc:
            problem = (
                f"{exc}; the node keeps its gpupilot.io/step annotation: run apply again to resume, or "
                f"restore {proto.CONFIG_LABEL}={current} and uncordon by hand"
            )
            self.progress(name, f"ROLLBACK FAILED: {problem}")
            return problem
        restored = f"restored {proto.CONFIG_LABEL}={node.config}" if node.config else "label untouched"
        self._event(
            node,
            "MigReconfigureFailed",
            f"gpupilot plan {self.plan.plan_id}: {reason}; {restored}, uncordoned",
            warning=True,
            retrier=r,
        )
        self.progress(name, f"rolled back: {restored}, uncordoned")
        return ""

    def _event(
        self, node: proto.NodeView, reason: str, message: str, *, warning: bool, retrier: Retrier
    ) -> None:
        body = proto.node_event(
            node,
            reason=reason,
            message=message,
            warning=warning,
            namespace=self.settings.event_namespace,
            now=_now(),
        )
        try:
            retrier.call(
                f"record Event {reason}", lambda: self.kube.create_event(self.settings.event_namespace, body)
            )
        except KubeError as exc:
            log.warning("%s: could not record Event %s: %s", node.name, reason, exc)
