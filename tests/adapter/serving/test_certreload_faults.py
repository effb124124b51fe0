"""The certificate watch outlives what it did not foresee: a client CA bundle with a byte that is not
UTF-8 in a comment between its PEM blocks is read as Go's PEM decoder reads it (the blocks, nothing
between them), at start and on reload; a reload that raises anything (here a UnicodeDecodeError)
is one line and a counted loop failure, the previous material stays, and the next change loads."""

from __future__ import annotations

import logging
import ssl
import time
from pathlib import Path

import pytest

from adapter.serving.certreload import FilesWatch
from adapter.serving.tlsutil import server_context
from tests.support.adapter.pki import Pki


def with_stray_byte(*pems: Path) -> bytes:
    """CA files joined with a Latin-1 comment between them (what an editor may leave)."""
    return b"# \xe9quipe r\xe9seau\n".join(p.read_bytes() for p in pems)


def test_a_ca_bundle_with_a_stray_byte_between_its_blocks_is_read_as_go_reads_it(pki: Pki) -> None:
    bundle = with_stray_byte(pki.front_proxy_ca.path, pki.client_ca.path)
    ctx = server_context(cert_file=pki.server.cert, key_file=pki.server.key, client_ca_pems=[bundle])
    assert len(ctx.get_ca_certs()) == 2
    assert ctx.verify_mode == ssl.CERT_OPTIONAL


def test_a_reload_that_raises_anything_is_counted_and_the_watch_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    watched = tmp_path / "ca.crt"
    watched.write_bytes(b"one")
    loaded: list[bytes] = []
    results: list[bool] = []
    failures: list[BaseException] = []

    def reload() -> None:
        data = watched.read_bytes()
        data.decode("utf-8")  # what the old reload did, unguarded
        loaded.append(data)

    watch = FilesWatch(
        [watched], reload=reload, on_result=results.append, on_failure=failures.append, what="client CAs"
    )
    thread = watch.start(0.02)
    try:
        with caplog.at_level(logging.ERROR):
            watched.write_bytes(b"# \xff\n")
            deadline = time.monotonic() + 5
            while not failures and time.monotonic() < deadline:
                time.sleep(0.01)
        assert [type(f) for f in failures] == [UnicodeDecodeError] and results == [False]
        watched.write_bytes(b"three, good")
        deadline = time.monotonic() + 5
        while not loaded and time.monotonic() < deadline:
            time.sleep(0.01)
        assert loaded == [b"three, good"] and results == [False, True]
        assert thread.is_alive()
    finally:
        watch.stop()
        thread.join(5)
    (line,) = [r.getMessage() for r in caplog.records if "UnicodeDecodeError" in r.getMessage()]
    assert "client CAs changed but cannot be used" in line and "\n" not in line
