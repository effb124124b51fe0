"""A loopback HTTP server answering each request with raw bytes a test chooses (a chunk cut in the
middle, a watch that ends at once), closing the connection after each answer."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable


def chunked(body: bytes, *, cut: bool = False) -> bytes:
    """A chunked HTTP answer; ``cut``: the connection closes in the middle of the only chunk."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    if cut:
        return head + b"%x\r\n" % (len(body) + 100) + body
    return head + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)


class FakeApi:
    """A loopback HTTP server answering each request with ``answer(path)`` (raw bytes), then closing."""

    def __init__(self, answer: Callable[[str], bytes]) -> None:
        self.answer = answer
        self.paths: list[str] = []
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with conn:
                request = conn.recv(65536).decode(errors="replace")
                path = request.split(" ")[1] if " " in request else ""
                self.paths.append(path)
                try:
                    conn.sendall(self.answer(path))
                except OSError:
                    continue

    def count(self, word: str) -> int:
        return sum(word in p for p in self.paths)

    def close(self) -> None:
        self._listener.close()
