"""The workload side of a node's change, as steps the applier runs around cordon, drain and relabel.

1. :meth:`WorkloadSteps.prepare` (before any change): the workloads of the pods to evict
   (:func:`rightsizer.apply.workloads.resolve`), refused when one cannot take its new request, and the
   fit check (:func:`rightsizer.apply.fit.shortfall`): nothing is evicted whose replacement would have
   nowhere to go. With ``--workloads gitops`` the patches are written here.
2. :meth:`WorkloadSteps.set_requests` (after the cordon, which records the changes on the node):
   patch each template (``patch``), or wait until the live templates changed (``gitops``).
3. :meth:`WorkloadSteps.settle` (after the MIG Manager's success and the uncordon): the post-condition.
4. :meth:`WorkloadSteps.restore` (rollback): the templates back to the old request.

Every template change goes through one check (:meth:`WorkloadSteps._move`): the workload is one the
in-flight record names (:mod:`rightsizer.apply.record`), with the pods the run found on the node,
and its own ``gpupilot.io/requests-changed-by`` mark agrees — unmarked or marked by the recorded plan
to set the new request, marked by the recorded plan to restore the old one. Nothing a node writes
can name a workload here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path

from rightsizer.apply import fit, gitops
from rightsizer.apply import protocol as proto
from rightsizer.apply import record as inflight
from rightsizer.apply import settle as postcondition
from rightsizer.apply import workloads as wl
from rightsizer.apply.retry import Retrier
from rightsizer.apply.settings import ApplySettings
from rightsizer.clients.kube import ConflictError, Kube, KubeError, NotFoundError
from rightsizer.errors import RightsizerError
from rightsizer.plan.disruption import evictions
from rightsizer.plan.model import NodePlan


class WorkloadsNotReady(RightsizerError):
    """A workload step failed after the node was changed; the node is rolled back with this reason."""


class WorkloadSteps:
    def __init__(
        self,
        kube: Kube,
        settings: ApplySettings,
        *,
        plan_id: str,
        clock: postcondition.Clock,
        progress: Callable[[str, str], None],
    ) -> None:
        self.kube, self.settings, self.plan_id = kube, settings, plan_id
        self.clock, self.progress = clock, progress

    def patches_dir(self) -> Path:
        return self.settings.gitops_dir / self.plan_id

    # -- 1. before any change ----------------------------------------------------------------------
    def prepare(self, pn: NodePlan, r: Retrier) -> tuple[wl.Change, ...]:
        """The node's workload changes; :class:`rightsizer.apply.workloads.WorkloadRefused` when a pod's
        request cannot change or a replacement would not fit."""
        pods = r.call(f"list pods on {pn.name}", lambda: self.kube.pods_on_node(pn.name))
        gpu_pods = [p for p in pods if proto.holds_gpus(p)]
        evicted = {(e.namespace, e.name) for e in evictions(pn, (proto.pod_key(p)[:2] for p in gpu_pods))}
        changes = r.call(
            f"read the workloads of the pods on {pn.name}",
            lambda: wl.resolve(self.kube, pn, gpu_pods, evicted),
        )
        if not changes:
            return ()
        nodes = r.call("list nodes", self.kube.list_nodes)
        everyone = r.call("list pods", self.kube.list_pods)
        short = fit.shortfall(
            node=pn.name,
            proposed=pn.proposed,
            strategy=pn.mig_strategy,
            nodes=nodes,
            pods=everyone,
            evicted=evicted,
            changes=changes,
        )
        if short:
            raise wl.WorkloadRefused(f"the replacements would not fit: {short}")
        for c in changes:
            if c.moves:
                self.progress(pn.name, f"{c.ref}: {c.old_request} → {c.new_request}")
        if self.settings.workloads == "gitops" and any(c.moves for c in changes):
            live = [
                (
                    c,
                    r.call(
                        f"read {c.ref}",
                        functools.partial(self.kube.get_workload, c.kind, c.namespace, c.name),
                    ),
                )
                for c in changes
                if c.moves
            ]
            for path in gitops.write_patches(self.settings.gitops_dir, self.plan_id, live):
                self.progress(pn.name, f"wrote {path}")
        return changes

    # -- 2. the requests ------------------------------------------------------------------------------
    def set_requests(self, pn: NodePlan, changes: Sequence[wl.Change], r: Retrier, *, plan_id: str) -> None:
        """``changes``: the in-flight record's; ``plan_id``: the recorded plan (the mark they get)."""
        moving = [c for c in changes if c.moves]
        if not moving:
            return
        if self.settings.workloads == "gitops":
            try:
                postcondition.wait_templates(
                    self.kube,
                    moving,
                    clock=self.clock,
                    timeout_s=self.settings.gitops_timeout_s,
                    interval_s=max(self.settings.retry_interval_s, 0.01),
                    retrier=r,
                    progress=lambda m: self.progress(pn.name, m),
                )
            except postcondition.NotSettled as exc:
                raise WorkloadsNotReady(str(exc)) from exc
            return
        for c in moving:
            if self._move(c, c.moves, r, node=pn.name, plan_id=plan_id, restore=False):
                self.progress(pn.name, f"patched {c.ref}: requests {c.new_request}")

    def _move(
        self, c: wl.Change, moves: Sequence[wl.Move], r: Retrier, *, node: str, plan_id: str, restore: bool
    ) -> bool:
        """Patch the template unless it already asks for the moves' new resources; True if patched.

        ``plan_id``: the recorded plan. Setting the new request (``restore`` False) needs the template
        unmarked or marked by that plan; restoring the old one needs it marked by that plan (a
        template someone changed since is theirs): else :class:`WorkloadsNotReady` (set) or False
        with a progress line (restore). A change with no pod found on the node is never applied."""
        if not c.pods:
            raise WorkloadsNotReady(f"{c.ref}: the in-flight record names no pod of it on the node")
        for _ in range(self.settings.conflict_retries):
            obj = r.call(
                f"read {c.ref}", functools.partial(self.kube.get_workload, c.kind, c.namespace, c.name)
            )
            mark = str(((obj.get("metadata") or {}).get("annotations") or {}).get(wl.ANN_CHANGED_BY) or "")
            if restore and mark != plan_id:
                self.progress(
                    node,
                    f"{c.ref} left as it is: its {wl.ANN_CHANGED_BY} is {mark or '(unset)'!r}, not plan "
                    f"{plan_id} (changed since by someone else, or never by this change)",
                )
                return False
            if not restore and mark not in ("", plan_id):
                raise WorkloadsNotReady(
                    f"{c.ref}: its {wl.ANN_CHANGED_BY} says plan {mark} changed its request; not changing it again"
                )
            if wl.has_moves_applied(wl.template_of(obj, c.kind), moves):
                return False
            patch = wl.template_patch(obj, c.kind, moves, plan_id="" if restore else plan_id)
            try:
                r.call(
                    f"patch {c.ref}",
                    functools.partial(self.kube.patch_workload, c.kind, c.namespace, c.name, patch),
                )
                return True
            except ConflictError:
                continue
        raise WorkloadsNotReady(f"{c.ref}: still conflicting after {self.settings.conflict_retries} tries")

    # -- 3. the post-condition ---------------------------------------------------------------------
    def settle(
        self, pn: NodePlan, changes: Sequence[wl.Change], r: Retrier
    ) -> tuple[postcondition.WorkloadState, ...]:
        if not changes:
            return ()
        try:
            return postcondition.wait_settled(
                self.kube,
                changes,
                clock=self.clock,
                timeout_s=self.settings.settle_timeout_s,
                interval_s=max(self.settings.retry_interval_s, 0.01),
                retrier=r,
                progress=lambda m: self.progress(pn.name, m),
            )
        except postcondition.NotSettled as exc:
            raise WorkloadsNotReady(str(exc)) from exc

    def observe(self, changes: Sequence[wl.Change]) -> tuple[postcondition.WorkloadState, ...]:
        """The table's rows after a failure (best effort: a row is left out when it cannot be read)."""
        out = []
        for c in changes:
            try:
                out.append(postcondition.observe(self.kube, c))
            except KubeError:
                continue
        return tuple(out)

    # -- 4. rollback -----------------------------------------------------------------------------------
    def restore(self, name: str, record: inflight.Record, r: Retrier) -> tuple[str, str]:
        """Put the templates the in-flight record names back to their old request:
        ``(problem, note)``, both "" when done; ``problem`` when a template could not be restored,
        ``note`` for what is left to people (templates that come from Git)."""
        changes = [c for c in record.changes if c.moves]
        if not changes:
            return "", ""
        if record.mode == "gitops":
            names = ", ".join(c.ref for c in changes)
            return (
                "",
                f"the templates of {names} come from Git: revert the patches in {self.patches_dir()} there",
            )
        problems = []
        for c in changes:
            try:
                if self._move(c, wl.reverse(c.moves), r, node=name, plan_id=record.plan_id, restore=True):
                    self.progress(name, f"restored {c.ref}: requests {c.old_request}")
            except NotFoundError:
                continue
            except (KubeError, WorkloadsNotReady) as exc:
                problems.append(f"{c.ref}: {exc}")
        return "; ".join(problems), ""
