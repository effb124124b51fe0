"""A real server binary run for tests, the demo and benchmarks: started on a loopback port with its
output in a log file, waited for until an HTTP health path answers 200, and stopped (terminate, then
kill after 20 s). Shared by :mod:`devkit.prometheus` and :mod:`devkit.victoriametrics`.
"""

from __future__ import annotations

import contextlib
import ctypes
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Self

import psutil

PORT_TRIES = 3
"""Launches on a fresh port when another process took the chosen one first (a free port is free only
until someone binds it: parallel test workers start servers all the time)."""


PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """``preexec_fn`` for servers the devkit starts: SIGTERM when the process that started them dies
    (a killed test run or demo leaves nothing behind)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def free_port() -> int:
    """A loopback port nobody listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listens_on(pid: int, port: int) -> bool:
    """Whether process ``pid`` holds the listening socket of ``port`` (not some other process)."""
    try:
        conns = psutil.Process(pid).net_connections(kind="inet")
    except psutil.Error:
        return False
    return any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in conns)


class _PortTaken(Exception):
    """The server could not bind its port: another process holds it."""


def log_tail(path: Path) -> str:
    """The last line of a log file ("" when there is none)."""
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1] if lines else ""


def _read_from(path: Path, offset: int) -> str:
    try:
        with path.open("rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")
    except OSError:
        return ""


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
        """Start ``cmd`` logging to ``log_file`` and wait until *this* process answers 200 on
        ``health_path``; on failure stop it and raise ``self.error`` naming the exit code or the wait,
        and the log. When another process took the port first, the same command is started again
        on a fresh port (its listen argument rewritten), up to :data:`PORT_TRIES` times."""
        for _ in range(PORT_TRIES):
            try:
                self._launch_once(cmd, name=name, health_path=health_path, timeout=timeout)
                return
            except _PortTaken:
                old, self.port = f"127.0.0.1:{self.port}", free_port()
                cmd = [a.replace(old, f"127.0.0.1:{self.port}") if "listen" in a.lower() else a for a in cmd]
        raise self.error(f"{name}: its port was taken by another process {PORT_TRIES} times in a row")

    def _launch_once(self, cmd: Sequence[str], *, name: str, health_path: str, timeout: float) -> None:
        log = self.log_file.open("ab")
        logged = log.tell()
        self._proc = proc = subprocess.Popen(list(cmd), stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                self.stop()
                if "address already in use" in _read_from(self.log_file, logged):
                    raise _PortTaken
                raise self.error(
                    f"{name} exited with {proc.returncode}; see {self.log_file}: {log_tail(self.log_file)}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}{health_path}", timeout=2) as r:
                    # a 200 from another server that holds the port says nothing about ours
                    if r.status == 200 and listens_on(proc.pid, self.port):
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
