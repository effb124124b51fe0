"""One ``apply`` at a time: a coordination.k8s.io Lease held for the duration of a run.

Two runs at once would both cordon and evict (each sees the other's nodes as "in flight" only after
the fact). Before its first write a run takes the Lease ``gpupilot-rightsizer-apply`` in the GPU
Operator's namespace, renews it every ``duration/3`` while it works, and gives it back at the end.
A second run finds it held and refuses, naming the holder; a Lease not renewed for its
``leaseDurationSeconds`` (a run that was killed) is taken over.

As in client-go's ``leaderelection``: holder identity, ``leaseDurationSeconds``, ``acquireTime`` /
``renewTime`` (RFC 3339 micro-times), ``leaseTransitions`` counted on each change of holder, and every
write guarded by ``resourceVersion`` so two takers cannot both win. Expiry is judged as client-go
does (:class:`~rightsizer.clients.lease.LeaseObserver`): on this process's monotonic clock, from when it
saw the holder's record last change. A run that finds the Lease held therefore watches it for up to
its duration: renewed meanwhile → refused (another run is alive); unchanged → taken over. Clocks
skewed between machines do not matter.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from gpupilot_common import loops
from rightsizer.apply.settings import ApplyError
from rightsizer.clients.kube import ConflictError, Kube
from rightsizer.clients.lease import LeaseObserver, lease_spec, micro, released_spec, write_lease

log = logging.getLogger(__name__)

LEASE_NAME = "gpupilot-rightsizer-apply"


def default_identity() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


RENEW_CONFLICT_RETRIES = 5
"""Conflicts answered by a re-read within one renewal before waiting for the next one."""


class ApplyLease:
    def __init__(
        self,
        kube: Kube,
        namespace: str,
        *,
        name: str = LEASE_NAME,
        identity: str | None = None,
        duration_s: int = 60,
        wall: Callable[[], dt.datetime] | None = None,
        on_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        """``wall``: the time written into ``renewTime``/``acquireTime`` (informational only);
        ``on_failure``: told of each renewal that failed (serve counts them)."""
        self._on_failure = on_failure
        self.kube, self.namespace, self.name = kube, namespace, name
        self.wall = wall or (lambda: dt.datetime.now(dt.UTC))
        self.identity = identity or default_identity()
        self.duration_s = max(1, int(duration_s))
        self.lost = threading.Event()
        """Set when a renewal found the Lease taken by someone else (the run should stop)."""
        self._renewed_at = 0.0  # monotonic time of the last successful write as holder
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._current: dict[str, Any] | None = None

    # -- taking and giving back ------------------------------------------------------------------
    def acquire(
        self,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        progress: Callable[[str, str], None] | None = None,
    ) -> None:
        """Take the Lease or raise :class:`ApplyError` naming who holds it. A Lease held by someone
        else is watched for up to its duration (``monotonic``/``sleep``: the caller's clock)."""
        observer = LeaseObserver(monotonic)
        first: tuple[object, object] | None = None
        while True:
            lease = self.kube.get_lease(self.namespace, self.name)
            spec = lease_spec(lease)
            holder = str(spec.get("holderIdentity") or "")
            if lease is None or not holder or holder == self.identity:
                break
            duration = float(spec.get("leaseDurationSeconds") or self.duration_s)
            record = (holder, spec.get("renewTime"))
            if first is None:
                first = record
                if progress is not None:
                    progress(
                        "-",
                        f"Lease {self.namespace}/{self.name} is held by {holder}: watching it for up to "
                        f"{duration:g}s to see whether that run is alive",
                    )
            elif record != first:
                raise ApplyError(
                    f"another apply is running: Lease {self.namespace}/{self.name} is held by {holder} "
                    f"(renewed while this run watched it; it expires {duration:g}s after its holder stops); "
                    "wait for it to finish"
                )
            if observer.expired(spec, default_duration_s=self.duration_s):
                log.warning(
                    "taking over Lease %s/%s from %s (not renewed for %gs)",
                    self.namespace,
                    self.name,
                    holder,
                    duration,
                )
                break
            sleep(max(0.01, min(duration / 6, 2.0)))
        now = self.wall()
        new_spec = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self.duration_s,
            "acquireTime": micro(now),
            "renewTime": micro(now),
            "leaseTransitions": int(spec.get("leaseTransitions") or 0)
            + (1 if holder and holder != self.identity else 0),
        }
        started = time.monotonic()
        try:
            self._current = write_lease(
                self.kube, lease, namespace=self.namespace, name=self.name, spec=new_spec
            )
            self._renewed_at = started
        except ConflictError as exc:
            raise ApplyError(
                f"another apply took Lease {self.namespace}/{self.name} at the same moment; wait for it to finish"
            ) from exc
        self._thread = threading.Thread(target=self._renew_loop, name="apply-lease", daemon=True)
        self._thread.start()

    def held(self) -> bool:
        """Whether this run may still act as the holder: renewed within two thirds of the duration
        (client-go's renew deadline), so nobody else can have taken it over yet."""
        return not self.lost.is_set() and time.monotonic() - self._renewed_at < self.duration_s * 2 / 3

    def stop_renewing(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def give_back(self) -> None:
        """Clear the holder (as client-go's ``ReleaseOnCancel``), so the next run need not wait for
        expiry; raises :class:`KubeError` (the caller retries or lets it expire)."""
        current = self._current
        if current is None or self.lost.is_set():
            return
        spec = released_spec(lease_spec(current))
        try:
            self.kube.replace_lease({**current, "spec": spec})
        except ConflictError:  # written meanwhile (a renewal that raced): re-read once
            fresh = self.kube.get_lease(self.namespace, self.name)
            if fresh is None or lease_spec(fresh).get("holderIdentity") != self.identity:
                return
            self.kube.replace_lease({**fresh, "spec": {**lease_spec(fresh), **spec}})
        self._current = None

    # -- renewing --------------------------------------------------------------------------------
    def renew(self) -> bool:
        """One renewal; False when the Lease is no longer ours (``lost`` is then set). A 409 (the
        object changed meanwhile) is answered by re-reading it and trying again, at most
        :data:`RENEW_CONFLICT_RETRIES` times: a server answering 409 forever cannot hold the thread."""
        for _ in range(RENEW_CONFLICT_RETRIES + 1):
            current = self._current
            if current is None:
                return False
            spec = {**lease_spec(current), "renewTime": micro(self.wall())}
            started = time.monotonic()
            try:
                self._current = self.kube.replace_lease({**current, "spec": spec})
                self._renewed_at = started
                return True
            except ConflictError:
                fresh = self.kube.get_lease(self.namespace, self.name)
                if fresh is None or lease_spec(fresh).get("holderIdentity") != self.identity:
                    log.error("lost Lease %s/%s to another holder", self.namespace, self.name)
                    self.lost.set()
                    return False
                self._current = fresh
        log.warning(
            "renewing Lease %s/%s: %d conflicts in a row; trying again at the next renewal",
            self.namespace,
            self.name,
            RENEW_CONFLICT_RETRIES + 1,
        )
        return True  # still ours as far as we know; expiry (measured by the others) is what matters

    def _renew_loop(self) -> None:
        interval = self.duration_s / 3
        lost = threading.Event()

        def once() -> None:
            if not self.renew():
                lost.set()

        # a failed renewal, whatever it raised, is one line and a count; the next comes at the usual
        # period (expiry is what matters: held() stops the run once renewals lapse)
        while not self._stop.wait(interval) and not lost.is_set():
            loops.guarded(
                f"renewing Lease {self.namespace}/{self.name}", once, logger=log, on_failure=self._on_failure
            )
