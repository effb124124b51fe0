"""Raw-socket clients that misbehave: a slow (slowloris) one and one with an oversized header."""

from __future__ import annotations

import socket
import time


def slow_client_is_closed(port: int, *, within: float) -> float:
    """Send half a request head and nothing more; return how long the server took to close it."""
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=within + 5) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        while s.recv(4096):  # the server may say 400/408 before it closes
            pass
    return time.monotonic() - start


def oversized_header_status(port: int, *, size: int) -> int:
    """Send a request with one header value of ``size`` bytes; return the status line's code."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * size + b"\r\n\r\n")
        head = b""
        while b"\r\n" not in head:
            chunk = s.recv(4096)
            if not chunk:
                break
            head += chunk
    return int(head.split(b" ", 2)[1])


def get(port: int, path: str) -> tuple[int, bytes]:
    """A well-behaved GET with ``Connection: close``."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body
