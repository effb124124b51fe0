"""Leader election for ``serve`` replicas through a coordination.k8s.io Lease, as client-go's
``leaderelection`` does it: the leader renews ``holderIdentity``'s ``renewTime`` every ``retry_s``;
the others try as often and take the Lease once its record has not changed for ``leaseDurationSeconds``
measured on their own monotonic clock from when they saw it change (never ``now − renewTime``: a
replica whose wall clock runs ahead would take a live Lease).
A leader that cannot renew for ``renew_deadline_s`` (two thirds of the duration) stops acting as
leader before anyone else may take over, so two replicas never both believe they lead.

Only the leader runs the report and the auto-apply; every replica plans (read-only, so /metrics of
each shows the latest plan).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from gpupilot_common import loops
from rightsizer.clients.kube import ConflictError, Kube, KubeError
from rightsizer.clients.lease import LeaseObserver, lease_spec, micro, released_spec, write_lease

log = logging.getLogger(__name__)

LEASE_NAME = "gpupilot-rightsizer-leader"


class LeaderElector:
    def __init__(
        self,
        kube: Kube,
        namespace: str,
        *,
        identity: str,
        duration_s: float = 15.0,
        name: str = LEASE_NAME,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], dt.datetime] | None = None,
        retry_s: float | None = None,
        on_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        """``monotonic``: expiry and renew deadlines; ``wall``: the times written into the Lease;
        ``retry_s``: client-go's RetryPeriod, how often to try or renew (default: a fifth of the
        duration; never beyond half the renew deadline); ``on_failure``: told of each round that
        failed (serve counts it in ``gpupilot_rightsizer_loop_failures_total{loop="leader-election"}``)."""
        self._on_failure = on_failure
        self.kube, self.namespace, self.name, self.identity = kube, namespace, name, identity
        self.monotonic = monotonic
        self.wall = wall or (lambda: dt.datetime.now(dt.UTC))
        self._observer = LeaseObserver(monotonic)
        self.duration_s = max(1.0, duration_s)
        self.renew_deadline_s = self.duration_s * 2 / 3
        self.retry_s = min(retry_s or self.duration_s / 5, self.renew_deadline_s / 2)
        self._renewed_at = 0.0  # monotonic time of our last successful write as holder
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def is_leader(self) -> bool:
        return self._renewed_at > 0 and self.monotonic() - self._renewed_at < self.renew_deadline_s

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="leader-election", daemon=True)
        self._thread.start()

    def stop(self, *, release: bool = True) -> None:
        """Stop competing; ``release`` clears the holder so another replica takes over at once."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if release and self.is_leader():
            try:
                lease = self.kube.get_lease(self.namespace, self.name)
                if lease is not None and lease_spec(lease).get("holderIdentity") == self.identity:
                    self.kube.replace_lease({**lease, "spec": released_spec(lease_spec(lease))})
            except KubeError as exc:
                log.warning("could not release the leader Lease (it expires by itself): %s", exc)
        self._renewed_at = 0.0

    def _loop(self) -> None:
        # a round that fails in any way (the API, or something nobody foresaw) is one line and a
        # count; the next round comes at the usual period: leadership lapses by itself at its renew
        # deadline, so a longer pause would only cost this replica its lead
        while not self._stop.is_set():
            loops.guarded(
                "leader election", self.try_acquire_or_renew, logger=log, on_failure=self._on_failure
            )
            self._stop.wait(self.retry_s)

    def try_acquire_or_renew(self) -> bool:
        """One round; True when we hold the Lease after it."""
        started = self.monotonic()  # leadership counts from before the write, never from after it
        now = self.wall()
        lease = self.kube.get_lease(self.namespace, self.name)
        spec: dict[str, Any] = lease_spec(lease)
        holder = spec.get("holderIdentity") or ""
        expired = self._observer.expired(spec, default_duration_s=self.duration_s)
        if lease is not None and holder and holder != self.identity and not expired:
            self._renewed_at = 0.0
            return False
        mine = holder == self.identity
        new_spec = {
            **spec,
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self.duration_s),
            "renewTime": micro(now),
            **({} if mine else {"acquireTime": micro(now)}),
            "leaseTransitions": int(spec.get("leaseTransitions") or 0) + (0 if mine or not holder else 1),
        }
        try:
            write_lease(self.kube, lease, namespace=self.namespace, name=self.name, spec=new_spec)
        except ConflictError:
            return False  # someone else wrote first: try again next round
        if not mine:
            log.info("became the leader (Lease %s/%s) as %s", self.namespace, self.name, self.identity)
        self._renewed_at = started
        return True
