"""A server that trickles its answer: a valid HTTP head (and body), one byte every ``every_s``
seconds, so that a client with per-read timeouts only would wait for ever. Loopback, free port."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

JSON_VECTOR = b'{"status":"success","data":{"resultType":"vector","result":[]}}'


def answer(body: bytes = JSON_VECTOR) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )


@contextlib.contextmanager
def trickling(data: bytes | None = None, *, every_s: float = 0.2) -> Iterator[str]:
    """``http://127.0.0.1:PORT`` of a server sending ``data`` (default :func:`answer`) a byte at a time."""
    payload = answer() if data is None else data
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(65536)
            except OSError:
                return
            for byte in payload:
                if stop.is_set():
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return
                time.sleep(every_s)

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        listener.close()
