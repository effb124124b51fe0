"""The demo's child processes: started in their own process groups, all stopped on the way out.

Every service the demo starts (exporters, cluster series, adapter) runs in a new session, so a
Ctrl-C in the terminal reaches the demo alone and the demo stops each group in order. On Linux the
children also get ``PR_SET_PDEATHSIG``: if the demo itself is killed with SIGKILL, the kernel
sends them SIGTERM, so nothing outlives it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from devkit.process import die_with_parent


class ServiceError(RuntimeError):
    """A child service exited or never became ready."""


@dataclass
class Service:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def log_tail(self, lines: int = 3) -> str:
        try:
            text = self.log.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join(text[-lines:])


@dataclass
class Supervisor:
    """Starts services and stops every one of them, newest first, exactly once."""

    log_dir: Path
    services: list[Service] = field(default_factory=list)

    def start(self, name: str, argv: Sequence[str], *, env: dict[str, str] | None = None) -> Service:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_dir / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                list(argv),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=die_with_parent,  # noqa: PLW1509 - only prctl, async-signal-safe
                env=env,
            )
        service = Service(name, proc, log)
        self.services.append(service)
        return service

    def wait_http(self, service: Service, url: str, *, timeout: float, insecure: bool = False) -> None:
        """Wait until ``url`` answers 2xx; fail with the service's last log lines if it exits."""
        ctx = ssl._create_unverified_context() if insecure else None  # noqa: S323 - local self-signed
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if service.proc.poll() is not None:
                raise ServiceError(
                    f"{service.name} exited with {service.proc.returncode}: {service.log_tail()} "
                    f"(log: {service.log})"
                )
            try:
                with urllib.request.urlopen(url, timeout=2, context=ctx) as resp:
                    if 200 <= resp.status < 300:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        raise ServiceError(f"{service.name} did not answer {url} within {timeout:.0f}s (log: {service.log})")

    def pids(self) -> list[int]:
        return [s.proc.pid for s in self.services]

    def stop_all(self, *, grace: float = 10.0) -> None:
        services, self.services = self.services, []
        for service in reversed(services):
            _signal_group(service.proc, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for service in reversed(services):
            remaining = max(0.1, deadline - time.monotonic())
            try:
                service.proc.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                _signal_group(service.proc, signal.SIGKILL)
                service.proc.wait(timeout=5)
            # Anything the service itself forked into its group goes too.
            _signal_group(service.proc, signal.SIGKILL, only_if_alive=False)


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals, *, only_if_alive: bool = True) -> None:
    if only_if_alive and proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def stop_group(proc: subprocess.Popen[bytes], *, grace: float = 10.0) -> None:
    """SIGTERM a child started with ``start_new_session=True`` and its group; SIGKILL after ``grace``."""
    _signal_group(proc, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        _signal_group(proc, signal.SIGKILL)
        proc.wait(timeout=5)
    _signal_group(proc, signal.SIGKILL, only_if_alive=False)


def popen_in_own_group(argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """A one-off child (e.g. the backfill) in its own process group that dies with the demo."""
    return subprocess.Popen(
        list(argv),
        start_new_session=True,
        preexec_fn=die_with_parent,  # noqa: PLW1509 - only prctl, async-signal-safe
        **kwargs,
    )


class Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def raise_on_signals() -> None:
    """Turn SIGTERM/SIGHUP (and SIGINT) into an exception so ``finally`` blocks clean up."""

    def handler(signum: int, _frame: FrameType | None) -> None:
        raise Interrupted(signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)
