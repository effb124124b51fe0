"""The config in use, swapped atomically on reload (SIGHUP or a changed file).

Requests read ``holder.current`` once and keep that object, so a reload never disturbs a request
in flight; a config that fails to parse is logged and counted, and the previous one stays.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from adapter.config.mapping import AdapterConfig, load_config
from adapter.errors import ConfigError
from gpupilot_common import loops
from gpupilot_common.text import one_line

log = logging.getLogger(__name__)


class ConfigHolder:
    def __init__(
        self,
        path: Path | None,
        *,
        on_result: Callable[[bool], None] | None = None,
        on_change: Callable[[], None] | None = None,
        on_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        """``on_failure``: told of a failure of the watch the reload did not foresee (counted)."""
        self._on_failure = on_failure
        self.path = path
        self.current: AdapterConfig = load_config(path)
        self.loaded_at = time.time()
        self._stamp = self._file_stamp()
        self._on_result = on_result
        self._on_change = on_change
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()

    def __call__(self) -> AdapterConfig:
        return self.current

    def _file_stamp(self) -> tuple[float, int, int] | None:
        if self.path is None:
            return None
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime, st.st_size, st.st_ino)

    def reload(self) -> bool:
        with self._lock:
            self._stamp = self._file_stamp()
            try:
                fresh = load_config(self.path)
            except Exception as exc:  # a reload failure is logged, counted and survived, always
                reason = str(exc) if isinstance(exc, ConfigError) else f"{type(exc).__name__}: {exc}"
                log.error("config reload failed, keeping the previous config: %s", one_line(reason))
                if self._on_result:
                    self._on_result(False)
                return False
            self.current, self.loaded_at = fresh, time.time()
        log.info(
            "config reloaded from %s: %d metrics, %d external",
            self.path,
            len(fresh.metrics),
            len(fresh.external),
        )
        if self._on_result:
            self._on_result(True)
        if self._on_change:
            self._on_change()
        return True

    def request_reload(self) -> None:
        """Signal-safe: the watcher thread does the work."""
        self._wake.set()

    def watch(self, interval: float) -> threading.Thread:
        pause = loops.Backoff(initial_s=interval, max_s=max(interval, 60.0))

        def once() -> None:
            woke = self._wake.wait(interval)
            if self._stop.is_set():
                return
            if woke or self._file_stamp() != self._stamp:
                # cleared only now: a SIGHUP sent after an edit the poll has just seen is answered
                # by this one reload, which reads the file after it (not by a second one)
                self._wake.clear()
                self.reload()

        def run() -> None:
            while not self._stop.is_set():
                # anything unforeseen (a failing on_change, an odd file): one line, counted, the
                # previous config kept, the watch goes on after a pause
                if loops.guarded("config watch", once, logger=log, on_failure=self._on_failure):
                    pause.reset()
                else:
                    self._stop.wait(pause.next_delay())

        thread = threading.Thread(target=run, name="config-watch", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
