"""The coordination.k8s.io Lease pieces that ``apply``'s run lock and ``serve``'s leader election
share: RFC 3339 micro-times as client-go writes them, the "held by someone else and not expired"
test (:class:`LeaseObserver`), the create-or-replace write (guarded by ``resourceVersion``) and the
released spec.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from rightsizer.clients.kube import Kube


def micro(t: dt.datetime) -> str:
    """A MicroTime as client-go writes it (``2006-01-02T15:04:05.000000Z``)."""
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_micro(text: object) -> dt.datetime | None:
    """A MicroTime as the API sends it (``…Z``) or as the client re-serialises it (``…+00:00``)."""
    if not isinstance(text, str) or not text:
        return None
    try:
        parsed = dt.datetime.fromisoformat(text)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def lease_spec(lease: dict[str, Any] | None) -> dict[str, Any]:
    """A copy of the Lease's spec (empty when there is no Lease)."""
    return dict((lease or {}).get("spec") or {})


def released_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` with the holder cleared (client-go's ``ReleaseOnCancel``): the next taker need not wait."""
    return {**spec, "holderIdentity": None, "leaseDurationSeconds": 1}


def write_lease(
    kube: Kube, lease: dict[str, Any] | None, *, namespace: str, name: str, spec: dict[str, Any]
) -> dict[str, Any]:
    """Create the Lease with ``spec`` (when ``lease`` is None) or replace ``lease``'s spec; raises the
    client's ``ConflictError`` when someone else wrote first."""
    if lease is None:
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name, "namespace": namespace},
            "spec": spec,
        }
        return kube.create_lease(namespace, body)
    return kube.replace_lease({**lease, "spec": spec})


class LeaseObserver:
    """Lease expiry as client-go's ``leaderelection`` judges it: by this process's monotonic clock,
    counted from when it saw the holder's record last change — never ``now − renewTime``, which a
    clock running ahead of the holder's would turn into a takeover of a live Lease."""

    def __init__(self, monotonic: Callable[[], float]) -> None:
        self._monotonic = monotonic
        self._record: tuple[object, ...] | None = None
        self._seen_at = 0.0

    def observe(self, spec: dict[str, Any]) -> float:
        """Record what the Lease says now; seconds since its record last changed, as seen here."""
        record = tuple(
            spec.get(k)
            for k in (
                "holderIdentity",
                "renewTime",
                "acquireTime",
                "leaseDurationSeconds",
                "leaseTransitions",
            )
        )
        now = self._monotonic()
        if record != self._record:
            self._record, self._seen_at = record, now
        return now - self._seen_at

    def expired(self, spec: dict[str, Any], *, default_duration_s: float) -> bool:
        """The holder did not renew for the Lease's duration since we first saw its current record
        (a Lease we see for the first time counts from now: it may have been renewed just before)."""
        unchanged = self.observe(spec)
        duration = float(spec.get("leaseDurationSeconds") or default_duration_s)
        return unchanged >= duration
