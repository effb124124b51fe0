"""Serving certificate and client CAs, reloaded when their files change.

cert-manager renews the serving Secret (and its CA injector updates the APIService's caBundle); the
kubelet swaps the mounted files through a symlink. Like the Kubernetes API server libraries, the
adapter notices the change (by the files' stat: mtime, size, inode, following symlinks) and builds
a new TLS context and authenticator for new connections; connections already open keep theirs. A
half-written or broken pair is refused with one error line and the previous material stays; so is
anything a reload did not foresee (a ``UnicodeDecodeError``, a bug): the watch is a long-lived loop
that only ends when told (:mod:`gpupilot_common.loops`), counting each failure.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from adapter.errors import AdapterError
from gpupilot_common import loops

log = logging.getLogger(__name__)

Stamp = tuple[tuple[float, int, int] | None, ...]


def _stamp(paths: Sequence[Path]) -> Stamp:
    out: list[tuple[float, int, int] | None] = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            out.append(None)
        else:
            out.append((st.st_mtime, st.st_size, st.st_ino))
    return tuple(out)


class FilesWatch:
    """Calls ``reload()`` when any of ``paths`` changes; ``reload`` raises ``AdapterError`` to refuse."""

    def __init__(
        self,
        paths: Sequence[Path],
        *,
        reload: Callable[[], None],
        on_result: Callable[[bool], None] | None = None,
        what: str = "TLS material",
        on_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        """``on_failure``: told of a failure the reload did not foresee (counted as a loop failure)."""
        self.paths = tuple(paths)
        self._reload = reload
        self._on_result = on_result
        self._on_failure = on_failure
        self._what = what
        self._stamp = _stamp(self.paths)
        self._stop = threading.Event()

    def check(self) -> bool | None:
        """Reload if a file changed: True (reloaded), False (refused), None (no change)."""
        stamp = _stamp(self.paths)
        if stamp == self._stamp:
            return None
        self._stamp = stamp
        try:
            self._reload()
        except AdapterError as exc:
            log.error("%s changed but cannot be used, keeping the previous one: %s", self._what, exc)
            ok = False
        except Exception as exc:  # unforeseen: the same refusal, one line, counted as a loop failure
            log.error(
                "%s; keeping the previous one",
                loops.failure_line(f"{self._what} changed but cannot be used", exc),
            )
            if self._on_failure is not None:
                self._on_failure(exc)
            ok = False
        else:
            log.info("%s reloaded from %s", self._what, ", ".join(str(p) for p in self.paths))
            ok = True
        if self._on_result is not None:
            self._on_result(ok)
        return ok

    def start(self, interval: float) -> threading.Thread:
        def run() -> None:
            loops.keep_running(
                f"{self._what} watch",
                self.check,
                stop=self._stop,
                interval=lambda: interval,
                logger=log,
                on_failure=self._on_failure,
                backoff=loops.Backoff(initial_s=interval, max_s=max(interval, 60.0)),
            )

        thread = threading.Thread(target=run, name="tls-watch", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self._stop.set()
