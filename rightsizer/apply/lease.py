"""One ``apply`` at a time: a coordination.k8s.io Lease held for the duration of a run.

Two runs at once would both cordon and evict (each sees the other's nodes as "in flight" only after
the fact). Before its first write a run takes the Lease ``gpupilot-rightsizer-apply`` in the GPU
Operator's namespace, renews it every ``duration/3`` while it works, and gives it back at the end.
A second run finds it held and refuses, naming the holder; a Lease not renewed for its
``leaseDurationSeconds`` (a run that was killed) is taken over.

As in client-go's ``leaderelection``: holder identity, ``leaseDurationSeconds``, ``acquireTime`` /
``renewTime`` (RFC 3339 micro-times), ``leaseTransitions`` counted on each change of holder, and every
write guarded by ``resourceVersion`` so two takers cannot both win. Expiry is judged from
``renewTime`` against this machine's clock, so clocks skewed by more than the duration misjudge it.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket
import threading
import uuid
from typing import Any

from rightsizer.apply.settings import ApplyError
from rightsizer.clients.kube import ConflictError, Kube, KubeError
from rightsizer.clients.lease import lease_spec, micro, parse_micro, released_spec, write_lease

log = logging.getLogger(__name__)

LEASE_NAME = "gpupilot-rightsizer-apply"


def default_identity() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class ApplyLease:
    def __init__(
        self,
        kube: Kube,
        namespace: str,
        *,
        name: str = LEASE_NAME,
        identity: str | None = None,
        duration_s: int = 60,
    ) -> None:
        self.kube, self.namespace, self.name = kube, namespace, name
        self.identity = identity or default_identity()
        self.duration_s = max(1, int(duration_s))
        self.lost = threading.Event()
        """Set when a renewal found the Lease taken by someone else (the run should stop)."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._current: dict[str, Any] | None = None

    # -- taking and giving back ------------------------------------------------------------------
    def acquire(self) -> None:
        """Take the Lease or raise :class:`ApplyError` naming who holds it."""
        now = dt.datetime.now(dt.UTC)
        lease = self.kube.get_lease(self.namespace, self.name)
        spec = lease_spec(lease)
        holder = spec.get("holderIdentity") or ""
        if lease is not None and holder and holder != self.identity:
            renewed = parse_micro(spec.get("renewTime")) or parse_micro(spec.get("acquireTime"))
            duration = int(spec.get("leaseDurationSeconds") or self.duration_s)
            if renewed is not None and (now - renewed).total_seconds() < duration:
                ago = max(0.0, (now - renewed).total_seconds())
                raise ApplyError(
                    f"another apply is running: Lease {self.namespace}/{self.name} is held by {holder} "
                    f"(renewed {ago:.0f}s ago, expires after {duration}s without renewal); wait for it to finish"
                )
            log.warning(
                "taking over Lease %s/%s from %s (not renewed in time)", self.namespace, self.name, holder
            )
        new_spec = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self.duration_s,
            "acquireTime": micro(now),
            "renewTime": micro(now),
            "leaseTransitions": int(spec.get("leaseTransitions") or 0)
            + (1 if holder and holder != self.identity else 0),
        }
        try:
            self._current = write_lease(
                self.kube, lease, namespace=self.namespace, name=self.name, spec=new_spec
            )
        except ConflictError as exc:
            raise ApplyError(
                f"another apply took Lease {self.namespace}/{self.name} at the same moment; wait for it to finish"
            ) from exc
        self._thread = threading.Thread(target=self._renew_loop, name="apply-lease", daemon=True)
        self._thread.start()

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
        """One renewal; False when the Lease is no longer ours (``lost`` is then set)."""
        current = self._current
        if current is None:
            return False
        spec = {**lease_spec(current), "renewTime": micro(dt.datetime.now(dt.UTC))}
        try:
            self._current = self.kube.replace_lease({**current, "spec": spec})
            return True
        except ConflictError:
            fresh = self.kube.get_lease(self.namespace, self.name)
            if fresh is not None and lease_spec(fresh).get("holderIdentity") == self.identity:
                self._current = fresh
                return self.renew()
            log.error("lost Lease %s/%s to another holder", self.namespace, self.name)
            self.lost.set()
            return False

    def _renew_loop(self) -> None:
        interval = self.duration_s / 3
        while not self._stop.wait(interval):
            try:
                if not self.renew():
                    return
            except KubeError as exc:  # transient: the next renewal may work; expiry is what matters
                log.warning("renewing Lease %s/%s failed: %s", self.namespace, self.name, exc)
