"""Why a guarded auto-apply must stop now, beside leadership: the emergency stop and a drain request.

Both are annotations of one ConfigMap (``auto_apply.stop_signal``; the chart names the rightsizer's
own config ConfigMap), so people and Helm hooks need no access to the rightsizer's pod:

* ``gpupilot.io/auto-apply: paused`` — the **emergency stop**: no node is started, a node in flight
  stops at its next safe step; removing the annotation resumes, the next run settling what the
  ledger and the nodes' recorded steps say is in flight first.
  ``kubectl -n gpupilot annotate configmap gpupilot-rightsizer gpupilot.io/auto-apply=paused``
* ``gpupilot.io/auto-apply-drain: <RFC 3339 time>`` — written by ``gpupilot-rightsizer drain`` (the
  chart's hook before an upgrade that switches auto-apply off, or before an uninstall): a serve that
  started before that time stops at its next safe step and starts nothing more; one started after it
  (the upgraded pod) ignores it.

The annotations are read through the API at most every :data:`TTL_S` seconds (each safe step asks);
an unreadable ConfigMap stops nothing (the apply Lease stops a run that lost the API) and is said
once."""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Mapping

log = logging.getLogger(__name__)

ANN_PAUSE = "gpupilot.io/auto-apply"
PAUSED = "paused"
ANN_DRAIN = "gpupilot.io/auto-apply-drain"
TTL_S = 5.0

Read = Callable[[], Mapping[str, str] | None]
"""The ConfigMap's annotations (None: it does not exist); raises when it cannot be read."""


def parse_time(text: str) -> float | None:
    """Unix seconds of an RFC 3339 time (``2026-12-07T10:00:00Z``), None when it is not one."""
    try:
        when = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


def reason_of(annotations: Mapping[str, str], *, started_at: float, where: str) -> str:
    """Why the annotations stop auto-apply ("" when they do not)."""
    if annotations.get(ANN_PAUSE, "").strip().lower() == PAUSED:
        return f"the emergency stop ({ANN_PAUSE}={PAUSED} on {where})"
    drain = annotations.get(ANN_DRAIN, "")
    when = parse_time(drain) if drain else None
    if when is not None and when >= started_at:
        return (
            f"a drain requested at {drain.strip()} ({ANN_DRAIN} on {where}: auto-apply is being switched off)"
        )
    return ""


class StopSignal:
    """The current stop reason from the annotations, read at most every ``ttl_s``."""

    def __init__(
        self,
        read: Read,
        *,
        where: str,
        started_at: float,
        ttl_s: float = TTL_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read = read
        self.where = where
        self.started_at = started_at
        self._ttl = ttl_s
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._checked = -float("inf")
        self._reason = ""
        self._problem = ""

    def reason(self) -> str:
        with self._lock:
            now = self._monotonic()
            if now - self._checked < self._ttl:
                return self._reason
            self._checked = now
            try:
                annotations = self._read()
            except Exception as exc:  # any failure to read: stop nothing, say so once
                problem = " ".join(str(exc).split()) or type(exc).__name__
                if problem != self._problem:
                    log.warning("cannot read the auto-apply stop signal (%s): %s", self.where, problem)
                self._problem = problem
                return self._reason
            if self._problem:
                log.info("the auto-apply stop signal (%s) is readable again", self.where)
                self._problem = ""
            reason = reason_of(annotations or {}, started_at=self.started_at, where=self.where)
            if reason != self._reason:
                log.warning("auto-apply: %s", reason) if reason else log.info(
                    "auto-apply resumes: %s cleared", self.where
                )
            self._reason = reason
            return reason
