"""A stand-in Prometheus on 127.0.0.1 that answers every query with a huge instant vector, streamed
as it is generated (one series per pod, ``series`` of them), for the answer-limit tests and the
benchmark: what a ``{namespace=~".*"}`` mistake or a label explosion sends back.

The answer is written in blocks of :data:`BLOCK` series without a Content-Length (HTTP/1.0 style:
the end of the answer is the end of the connection), so a client that stops reading early makes
the server stop generating too. ``bytes_sent`` says how much of it went out.
"""

from __future__ import annotations

import socketserver
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import psutil

BLOCK = 1000
HEAD = b'{"status":"success","data":{"resultType":"vector","result":['
TAIL = b"]}}"


def series_block(start: int, count: int) -> bytes:
    """``count`` series (a comma before each but the very first of the answer)."""
    return "".join(
        ("," if i else "") + '{"metric":{"__name__":"DCGM_FI_DEV_GPU_UTIL","namespace":"ai-serving",'
        f'"pod":"pod-{i:07d}","Hostname":"node-{i // 8:06d}","gpu":"{i % 8}",'
        f'"UUID":"GPU-{i:08x}-0000-0000-0000-000000000000"}},"value":[1764500000,"{i % 100}"]}}'
        for i in range(start, start + count)
    ).encode()


def compact_block(start: int, count: int) -> bytes:
    """``count`` compact series: two short labels each (about 75 bytes a series), the shape that
    costs the most memory per byte once parsed."""
    return "".join(
        ("," if i else "")
        + f'{{"metric":{{"pod":"p{i:07d}","gpu":"{i % 8}"}},"value":[1764500000,"{i % 100}"]}}'
        for i in range(start, start + count)
    ).encode()


def answer_labels(series: int) -> int:
    """Label pairs of the whole answer as the reader counts them (``":"``): six per series, and the
    answer's ``status`` and ``resultType``."""
    return 6 * series + 2


def answer_size(series: int) -> int:
    """Bytes of the whole answer (for the tables: what an unbounded client would read)."""
    return (
        len(HEAD)
        + len(TAIL)
        + sum(len(series_block(s, min(BLOCK, series - s))) for s in range(0, series, BLOCK))
    )


class _Handler(socketserver.StreamRequestHandler):
    """Reads one request (head and any form body) and streams the answer; HTTP/1.0 framing, so a
    few lines on a socket do (the project serves HTTP through gpupilot_common.httpserve, whose
    answers are whole bodies, not streams)."""

    server: HugeAnswerServer

    def handle(self) -> None:
        length = 0
        while (line := self.rfile.readline(65536)) not in (b"\r\n", b"\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip() or 0)
        self.rfile.read(length)
        try:
            self._send(b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n")
            self._send(HEAD)
            # looked up now, not in a table made at import: tests swap series_block for fatter series
            block = compact_block if self.server.shape == "compact" else series_block
            for start in range(0, self.server.series, BLOCK):
                self._send(block(start, min(BLOCK, self.server.series - start)))
            self._send(TAIL)
        except OSError:  # the client stopped reading (over its limit): stop generating
            pass

    def _send(self, data: bytes) -> None:
        self.wfile.write(data)
        with self.server.lock:
            self.server.bytes_sent += len(data)


class HugeAnswerServer(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, series: int, *, shape: str = "dcgm") -> None:
        """``shape``: ``dcgm`` (dcgm-exporter's series, six labels, about 200 bytes each) or
        ``compact`` (:func:`compact_block`)."""
        super().__init__(("127.0.0.1", 0), _Handler)
        self.series = series
        self.shape = shape
        self.bytes_sent = 0
        self.lock = threading.Lock()
        self._thread = threading.Thread(target=self.serve_forever, name="huge-answer", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def __enter__(self) -> HugeAnswerServer:
        self._thread.start()
        return self

    def __exit__(
        self, typ: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.shutdown()
        self.server_close()


@dataclass(frozen=True)
class Measured:
    code: int
    """Exit status (-9 when killed at the time limit)."""
    stderr: str
    peak_rss: int
    """Highest resident set size seen, bytes (sampled every 10 ms with psutil)."""
    seconds: float


def run_measured(args: list[str], *, cwd: Path, limit: float) -> Measured:
    """Run a command, sampling its memory until it exits (killed after ``limit`` seconds)."""
    started = time.monotonic()
    proc = subprocess.Popen(args, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    watched, peak = psutil.Process(proc.pid), 0
    try:
        while proc.poll() is None and time.monotonic() - started < limit:
            try:
                peak = max(peak, watched.memory_info().rss)
            except psutil.Error:
                break
            time.sleep(0.01)
    finally:
        if proc.poll() is None:
            proc.kill()
    _, err = proc.communicate()
    return Measured(proc.returncode, err.decode(), peak, time.monotonic() - started)
