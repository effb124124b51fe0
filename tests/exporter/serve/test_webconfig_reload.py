"""The --web-config TLS certificate is re-read when its files change, as exporter-toolkit reads it per
connection: a renewed certificate is served to the next connection, a broken one (not PEM, a stray
non-UTF-8 byte) is one line and a count while the last good certificate stays served, and the
renewal after it is served again."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import ssl
import time
from pathlib import Path

import pytest
from cryptography import x509

from devkit.pki import make_ca
from exporter.collect.collector import Collector
from exporter.serve import webconfig
from exporter.serve.server import MetricsServer
from gpupilot_common import loops


def served_cn(url: str, ca: Path) -> str:
    host, port = url.removeprefix("https://").rsplit(":", 1)
    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.check_hostname = False
    with socket.create_connection((host, int(port)), timeout=5) as raw, ctx.wrap_socket(raw) as conn:
        cert = x509.load_der_x509_certificate(conn.getpeercert(True) or b"")
    return str(cert.subject.rfc4514_string())


def replace(src: Path, dst: Path) -> None:
    """As kubelet swaps a Secret volume: a new file renamed over the old one (new inode)."""
    tmp = dst.with_suffix(".tmp")
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def test_a_renewed_certificate_is_served_and_a_broken_one_never_stops_the_reloading(
    tmp_path: Path, one_gpu_collector: Collector, caplog: pytest.LogCaptureFixture
) -> None:
    ca = make_ca(tmp_path / "ca", "ca")
    first, second, third = (
        ca.issue(tmp_path / "ca", cn=n, server=True, stem=n) for n in ("first", "second", "third")
    )
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    shutil.copyfile(first.cert, cert)
    shutil.copyfile(first.key, key)
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n")
    failures = loops.LoopFailures()
    with MetricsServer(
        one_gpu_collector, host="127.0.0.1", port=0, web_config=webconfig.load(web), failures=failures
    ) as srv:
        assert served_cn(srv.url, ca.path) == "CN=first"
        replace(second.key, key)
        replace(second.cert, cert)
        assert served_cn(srv.url, ca.path) == "CN=second"
        # a half-written renewal, a stray byte: the last good pair stays, the failure is counted
        with caplog.at_level(logging.INFO):
            cert.write_bytes(b"# \xff not PEM\n" + third.cert.read_bytes()[:40])
            time.sleep(0.01)
            assert served_cn(srv.url, ca.path) == "CN=second"
        assert failures.get("tls-reload") == 1
        lines = [r.getMessage() for r in caplog.records if "TLS reload" in r.getMessage()]
        assert len(lines) == 1 and "\n" not in lines[0] and "--web-config" in lines[0], lines
        replace(third.key, key)
        replace(third.cert, cert)
        assert served_cn(srv.url, ca.path) == "CN=third"
        assert srv.tls is not None and srv.tls.reloads == 2
