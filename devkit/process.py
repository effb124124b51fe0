"""A real server binary run for tests, the demo and benchmarks: started on a loopback port with its
output in a log file, waited for until an HTTP health path answers 200, and stopped (terminate, then
kill after 20 s). Shared by :mod:`devkit.prometheus` and :mod:`devkit.victoriametrics`.
"""

from __future__ import annotations

import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Self


def log_tail(path: Path) -> str:
    """The last line of a log file ("" when there is none)."""
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1] if lines else ""


def stop_process(proc: subprocess.Popen[bytes] | None) -> None:
    """Terminate ``proc`` (if still running), killing it after 20 s."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


class LoopbackServer:
    """A binary serving HTTP on 127.0.0.1:``port``; subclasses set ``port``/``log_file`` and define
    :meth:`start` (build the command line, then :meth:`_launch`). Use as a context manager."""

    port: int
    log_file: Path
    error: type[Exception] = RuntimeError
    _proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        """The running server's process id (benchmarks read its peak RSS)."""
        if self._proc is None:
            raise self.error("not running")
        return self._proc.pid

    def start(self, *, timeout: float = 60.0) -> Self:
        raise NotImplementedError

    def _launch(self, cmd: Sequence[str], *, name: str, health_path: str, timeout: float) -> None:
        """Start ``cmd`` logging to ``log_file`` and wait for ``health_path``; on failure stop it and
        raise ``self.error`` naming the exit code or the wait, and the log."""
        log = self.log_file.open("ab")
        self._proc = proc = subprocess.Popen(list(cmd), stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                self.stop()
                raise self.error(
                    f"{name} exited with {proc.returncode}; see {self.log_file}: {log_tail(self.log_file)}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}{health_path}", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        self.stop()
        raise self.error(f"{name} not ready after {timeout:.0f}s; see {self.log_file}")

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        stop_process(proc)

    def __enter__(self) -> Self:
        if self._proc is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
