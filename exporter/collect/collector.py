"""The background collection loop: backend → snapshot → families → one pre-rendered page.

Every ``interval`` the collector reads the backend on a deadline worker (a hung call never blocks
the loop, and the last good snapshot keeps being served with its growing age), refreshes pod
attribution from an injected allocations source, builds the device families
(:func:`exporter.expose.exposition.device_families`) plus the exporter's own health families, renders them
once (:func:`exporter.expose.render.render_page`) and swaps the new :class:`~exporter.expose.render.Page` in with
one assignment. Scrapes only ever read ``collector.page``.

Failures and what they do:

* ``open()`` raises :class:`BackendUnavailable` (NVML init) → retried with exponential backoff;
  ``gpupilot_exporter_backend_up 0``; error kind ``init``.
* ``read()`` hangs past ``collect_timeout`` → kind ``timeout``; last snapshot stays.
* ``read()`` raises → kind ``read`` (a :class:`BackendUnavailable` there also re-opens the backend).
* per-field errors in the snapshot → counted by the snapshot's own kinds (``field:…``, ``gpm``…).
* the allocations source raises → kind ``podresources``, series without pod labels, a log line.
* a claimed (DRA) device names nothing on this node → kind ``dra``, that device without pod labels,
  a log line naming the claim.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from exporter.attribute import sharing
from exporter.attribute.podresources import dra
from exporter.attribute.podresources.dra import Attribution
from exporter.collect import availability
from exporter.collect.backend import Backend
from exporter.collect.deadline import CallTimeout, DeadlineWorker
from exporter.contract.layout import SeriesLayout
from exporter.errors import BackendError, BackendUnavailable
from exporter.expose.exposition import Family, device_families
from exporter.expose.render import Page, render_page
from exporter.expose.windows import EventWindows
from exporter.settings import CollectorSettings
from exporter.snapshot import Allocations, NodeSnapshot, PodRef
from gpupilot_common import loops

log = logging.getLogger(__name__)

AllocationsSource = Callable[[], Allocations | Attribution]
"""Returns device id → containers, or an :class:`Attribution` whose claimed (DRA) devices are resolved
against the snapshot; may raise (socket missing, kubelet erroring)."""

OwnersSource = Callable[[Iterable[int]], Mapping[int, PodRef]]
"""Host PIDs → the containers they run in (:class:`exporter.attribute.procs.ContainerIndex`, or the simulator's)."""

CACHED_NOTE = " Cached: refreshed every collection interval, see gpupilot_exporter_snapshot_age_seconds."

BASE_ERROR_KINDS = ("init", "read", "timeout")

SLOW_SHARE = 0.5
"""A collection longer than this share of the interval is logged (once per slow spell)."""

SHOWN_NAME = 64
"""Characters of a claim's or device's name shown in a log line (a kubelet answer may carry any)."""


def _shown(name: str) -> str:
    text = name if name.isprintable() else ascii(name)[1:-1]
    return text if len(text) <= SHOWN_NAME else f"{text[: SHOWN_NAME - 3]}..."


class Collector:
    def __init__(
        self,
        backend: Backend,
        *,
        hostname: str,
        settings: CollectorSettings,
        allocations: AllocationsSource | None = None,
        layout: SeriesLayout | None = None,
        process_owners: OwnersSource | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        loop_failures: loops.LoopFailures | None = None,
    ) -> None:
        """``loop_failures``: the failures of the exporter's long-lived loops (this one counts under
        ``collector``), its ``gpupilot_exporter_loop_failures_total``."""
        self.backend = backend
        self.loop_failures = loop_failures or loops.LoopFailures()
        self.loop_failures.register("collector")
        self.hostname = hostname
        self.settings = settings
        self.layout = layout or SeriesLayout()
        self._windows = EventWindows(
            xid_window_s=self.layout.xid_window_s,
            clock_events_window_s=self.layout.clock_events_window_s,
        )
        self._allocations_source = allocations
        self._process_owners = process_owners
        self._clock = clock
        self._wall_clock = wall_clock
        self._worker = DeadlineWorker(f"{backend.name}-backend")
        kinds = (*BASE_ERROR_KINDS, "podresources", "dra") if allocations is not None else BASE_ERROR_KINDS
        self._errors: dict[str, int] = dict.fromkeys(kinds, 0)
        self._opened = False
        self._backoff = settings.backoff_initial
        self._next_open_at = 0.0
        self._backend_up = False
        self._last_duration: float | None = None
        self._last_success_wall: float | None = None
        self._snapshot: NodeSnapshot | None = None
        self._snapshot_at: float | None = None
        self._device_families: list[Family] = []
        self._fields_checked = False
        self._dra_mode = ""
        self._allocations_error: str | None = None
        self._dra_note = ""
        self._slow = False
        """Whether the last collection took longer than :data:`SLOW_SHARE` of the interval (logged once
        per slow spell)."""
        self.last_error = ""
        """One line on why the last attempt failed (empty after a success)."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._page = self._render()

    # -- what scrapes read ---------------------------------------------------------------------
    @property
    def page(self) -> Page:
        return self._page

    @property
    def snapshot(self) -> NodeSnapshot | None:
        return self._snapshot

    @property
    def errors(self) -> dict[str, int]:
        return dict(self._errors)

    def readiness(self) -> tuple[bool, str]:
        """(ready, one line why): a good snapshot exists, younger than ``ready_intervals`` intervals."""
        at = self._page.snapshot_at
        limit = self.settings.ready_intervals * self.settings.interval
        if at is None:
            why = f": {self.last_error}" if self.last_error else ""
            return False, f"not ready: no successful collection yet{why}"
        age = self._clock() - at
        if age > limit:
            why = f": {self.last_error}" if self.last_error else ""
            return False, f"not ready: last good snapshot is {age:.1f}s old (limit {limit:g}s){why}"
        return True, f"ready: snapshot {age:.1f}s old"

    # -- one collection ------------------------------------------------------------------------
    def collect_once(self) -> bool:
        """One attempt. True when a new snapshot is being served; False otherwise (see ``last_error``)."""
        start = self._clock()
        if not self._opened and not self._open(start):
            return False
        try:
            snap = self._worker.call(self.backend.read, timeout=self.settings.collect_timeout)
        except CallTimeout as exc:
            self._fail("timeout", f"backend read timed out: {exc}", start)
            return False
        except BackendUnavailable as exc:
            self._close_backend()
            self._schedule_reopen(start)
            self._fail("read", f"backend became unavailable: {exc}", start)
            return False
        except BackendError as exc:
            self._fail("read", f"backend read failed: {exc}", start)
            return False
        except Exception as exc:  # a backend bug must not kill the loop; the scrape stays up
            log.exception("unexpected error from %s backend read", self.backend.name)
            self._fail("read", f"backend read failed: {type(exc).__name__}: {exc}", start)
            return False
        allocations = self._read_allocations(snap)
        owners = self._owners(snap)
        families = device_families(
            snap,
            hostname=self.hostname,
            allocations=allocations,
            layout=self.layout,
            windows=self._windows.update(snap),
            shares=sharing.device_shares(snap, owners) if owners and self.layout.virtual_gpus else None,
        )
        if owners is not None:
            families.extend(
                sharing.pod_usage_families(snap, owners, hostname=self.hostname, layout=self.layout)
            )
        families.extend(self._dra_families())
        for kind, count in snap.field_errors.items():
            self._errors[kind] = self._errors.get(kind, 0) + count
        now = self._clock()
        if not self._fields_checked:  # once: the GPUs and the configured fields do not change
            self._fields_checked = True
            if line := availability.missing_fields_line(
                (m.source for m in self.layout.selection.metrics), snap
            ):
                log.warning("%s", line)
        self._snapshot, self._snapshot_at, self._device_families = snap, now, families
        self._backend_up = True
        self._last_duration = now - start
        self._note_duration(self._last_duration, snap, allocations)
        self._last_success_wall = self._wall_clock()
        self.last_error = ""
        self._page = self._render()
        return True

    def _note_duration(self, took: float, snap: NodeSnapshot, allocations: Allocations | None) -> None:
        """One warning when collections start taking more than :data:`SLOW_SHARE` of the interval (with
        what they carried), one info line when they are back under it."""
        slow = took > SLOW_SHARE * self.settings.interval
        if slow and not self._slow:
            holders = sum(len(v) for v in allocations.values()) if allocations else 0
            log.warning(
                "collection took %.2fs of its %gs interval (%d GPUs, %d device holders); "
                "gpupilot_exporter_collection_duration_seconds has each one's time",
                took,
                self.settings.interval,
                len(snap.gpus),
                holders,
            )
        elif self._slow and not slow:
            log.info("collection back under %g%% of its interval (%.2fs)", SLOW_SHARE * 100, took)
        self._slow = slow

    def _open(self, now: float) -> bool:
        if now < self._next_open_at:
            return False
        try:
            self._worker.call(self.backend.open, timeout=self.settings.collect_timeout)
        except (BackendError, OSError) as exc:
            self._schedule_reopen(now)
            kind = "timeout" if isinstance(exc, CallTimeout) else "init"
            self._fail(kind, f"backend {self.backend.name} unavailable: {exc}", now, quiet=True)
            log.warning("%s; retrying in %.1fs", self.last_error, self._next_open_at - now)
            return False
        if self._backoff > self.settings.backoff_initial:
            log.info("backend %s available again", self.backend.name)
        self._opened = True
        self._backoff = self.settings.backoff_initial
        return True

    def _schedule_reopen(self, now: float) -> None:
        self._next_open_at = now + self._backoff
        self._backoff = min(self._backoff * 2, self.settings.backoff_max)

    def _close_backend(self) -> None:
        self._opened = False
        try:
            self._worker.call(self.backend.close, timeout=self.settings.collect_timeout)
        except Exception as exc:  # closing a broken backend may fail too; we re-open anyway
            log.debug("closing %s backend failed: %s", self.backend.name, exc)

    def _fail(self, kind: str, message: str, start: float, *, quiet: bool = False) -> None:
        self._errors[kind] = self._errors.get(kind, 0) + 1
        self._backend_up = False
        self._last_duration = self._clock() - start
        if message != self.last_error and not quiet:
            log.warning("%s", message)
        self.last_error = message
        self._page = self._render()

    def _read_allocations(self, snap: NodeSnapshot) -> Allocations | None:
        if self._allocations_source is None:
            return None
        try:
            found = self._allocations_source()
            allocations = self._resolve_claims(found, snap) if isinstance(found, Attribution) else found
        except Exception as exc:  # socket missing, kubelet erroring: no pod labels, never a failed scrape
            self._errors["podresources"] += 1
            message = f"pod attribution unavailable, serving series without pod labels: {exc}"
            if message != self._allocations_error:
                log.warning("%s", message)
            self._allocations_error = message
            return None
        if self._allocations_error is not None:
            log.info("pod attribution available again")
            self._allocations_error = None
        return allocations

    def _owners(self, snap: NodeSnapshot) -> sharing.PidOwners | None:
        """PID → container for the GPU processes (per-pod figures on shared GPUs,
        :mod:`exporter.attribute.sharing`); None when no GPU has per-process accounting or no owner
        source is configured."""
        if self._process_owners is None:
            return None
        pids = [p.pid for g in snap.gpus for p in (g.processes or ())]
        if not pids:
            return None
        try:
            return self._process_owners(pids)
        except Exception as exc:  # an unreadable /proc must not fail the collection
            self._errors["processes"] = self._errors.get("processes", 0) + 1
            log.warning("per-pod GPU figures unavailable: %s", exc)
            return None

    def _resolve_claims(self, found: Attribution, snap: NodeSnapshot) -> Allocations:
        self._dra_mode = dra.mig_mode(found.slices)
        resolved = found.resolve(snap)
        note = ""
        if resolved.unresolved:
            self._errors["dra"] = self._errors.get("dra", 0) + len(resolved.unresolved)
            names = ", ".join(
                f"{_shown(c.claim_namespace)}/{_shown(c.claim_name)} ({_shown(c.pool)}/{_shown(c.device)})"
                for c in resolved.unresolved
            )
            why = f"; ResourceSlices unavailable: {found.slices_note}" if found.slices is None else ""
            note = f"claimed device(s) not found on this node, served without pod labels: {names}{why}"
        if note and note != self._dra_note:
            log.warning("%s", note)
        self._dra_note = note
        return resolved.allocations

    @property
    def attribution_note(self) -> str:
        """The last collection's line about claimed devices it could not attribute ("" when none):
        logged as a warning once per change, and printed by ``--once``, whose log shows errors only."""
        return self._dra_note

    def _dra_families(self) -> list[Family]:
        """``gpupilot_dra_node_info``: NVIDIA's DRA driver serves this node, and whether with DynamicMIG
        (the rightsizer never plans a MIG Manager change for such a node)."""
        if not self._dra_mode:
            return []
        host = self.layout.host_label
        labels = ((host, self.hostname),) if host is not None else ()
        return [
            Family(
                "gpupilot_dra_node_info",
                "gauge",
                "NVIDIA's DRA driver serves this node's GPUs (value 1, from its ResourceSlices): mig_mode "
                "dynamic when they advertise MIG devices without uuid (DynamicMIG, instances made per "
                "claim: the MIG Manager must not run here), static otherwise.",
                [((*labels, ("dra_driver_name", dra.NVIDIA_DRIVER), ("mig_mode", self._dra_mode)), 1.0)],
            )
        ]

    # -- rendering ------------------------------------------------------------------------------
    def _self_families(self) -> list[Family]:
        b = (("backend", self.backend.name),)
        fams = [
            Family(
                "gpupilot_exporter_backend_up",
                "gauge",
                "1 when the last collection read the backend, 0 while it is unavailable, failing or hung.",
                [(b, 1.0 if self._backend_up else 0.0)],
            ),
            Family(
                "gpupilot_exporter_collection_errors_total",
                "counter",
                "Collection errors since start, by kind (init, read, timeout, podresources, field:<name>…).",
                [((*b, ("kind", k)), float(v)) for k, v in sorted(self._errors.items())],
            ),
            Family(
                "gpupilot_exporter_loop_failures_total",
                "counter",
                "Failures a long-lived loop survived since start (collector, resourceslices, tls-reload): "
                "each logged in one line, the last good state kept, retried after a growing pause.",
                [((("loop", k),), float(v)) for k, v in sorted(self.loop_failures.snapshot().items())],
            ),
        ]
        if self._last_duration is not None:
            fams.append(
                Family(
                    "gpupilot_exporter_collection_duration_seconds",
                    "gauge",
                    "Seconds the last collection attempt took (backend read, pod attribution, series).",
                    [(b, self._last_duration)],
                )
            )
        if self._last_success_wall is not None:
            fams.append(
                Family(
                    "gpupilot_exporter_last_success_timestamp_seconds",
                    "gauge",
                    "Unix time of the last successful collection.",
                    [(b, self._last_success_wall)],
                )
            )
        return fams

    def _render(self) -> Page:
        cached = [Family(f.name, f.kind, f.help + CACHED_NOTE, f.samples) for f in self._device_families]
        fams: Sequence[Family] = [*cached, *self._self_families()]
        return render_page(fams, snapshot_at=self._snapshot_at, age_labels=(("backend", self.backend.name),))

    # -- the loop -------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="collector", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._opened and not self._worker.busy:
            self._close_backend()
        self._worker.close()

    def _loop(self) -> None:
        pause = loops.Backoff(initial_s=self.settings.interval, max_s=max(self.settings.interval, 60.0))
        while not self._stop.is_set():
            started = self._clock()
            # anything collect_once did not foresee: one line, counted, the last page kept
            if not loops.guarded(
                "collection",
                self.collect_once,
                logger=log,
                on_failure=self.loop_failures.counter("collector"),
            ):
                self._stop.wait(pause.next_delay())
                continue
            pause.reset()
            if self._opened:
                wait = self.settings.interval - (self._clock() - started)
            else:
                wait = self._next_open_at - self._clock()
            self._stop.wait(max(0.0, wait))
