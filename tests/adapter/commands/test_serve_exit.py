"""``serve`` ending on a fatal start-up error (no TLS files, a port taken): one line, exit 2, and the
Prometheus client's session closed on the way out (no asyncio "Unclosed client session" ERROR after
the message)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from devkit.prometheus import free_port

REPO = Path(__file__).resolve().parents[3]


def _serve(*extra: str) -> subprocess.CompletedProcess[str]:
    # a Prometheus that is not there: the client still opens its session (scrape_interval asks it)
    closed = f"http://127.0.0.1:{free_port()}"
    return subprocess.run(
        [sys.executable, "-m", "adapter", "serve", "--prometheus-url", closed, "--pod-source", "none",
         "--authorization-mode", "none", *extra],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


@pytest.mark.slow
def test_no_tls_files_ends_with_one_line_and_the_session_closed() -> None:
    run = _serve()
    assert run.returncode == 2, run.stderr
    assert "TLS is required" in run.stderr
    assert "Unclosed" not in run.stderr and "ERROR" not in run.stderr, run.stderr


@pytest.mark.slow
def test_a_taken_port_ends_with_one_line_and_the_session_closed(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = _serve(
            "--bind-address", "127.0.0.1", "--secure-port", str(port),
            "--self-signed-cert-dir", str(tmp_path / "tls"),
        )  # fmt: skip
    assert run.returncode == 2, run.stderr
    assert f"--secure-port {port}" in run.stderr
    assert "Unclosed" not in run.stderr and "Traceback" not in run.stderr, run.stderr
