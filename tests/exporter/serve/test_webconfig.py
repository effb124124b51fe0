"""``--web-config`` parsing: good files load; every bad file fails with one line naming file, field and fix."""

from __future__ import annotations

import base64
import time
from pathlib import Path

import bcrypt
import pytest

from exporter.errors import ConfigError
from exporter.serve import webconfig
from tests.support.exporter import pki as pki_mod

HASH = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(4)).decode()


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "web.yml"
    p.write_text(text)
    return p


def error_of(path: Path) -> str:
    with pytest.raises(ConfigError) as info:
        webconfig.load(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(str(path))
    return message


def test_full_config_loads(tmp_path: Path, exporter_pki: pki_mod.Pki) -> None:
    p = write(
        tmp_path,
        f"""
tls_server_config:
  cert_file: {exporter_pki.server_cert}
  key_file: {exporter_pki.server_key}
  client_auth_type: RequireAndVerifyClientCert
  client_ca_file: {exporter_pki.ca_cert}
  min_version: TLS13
http_server_config:
  headers:
    X-Frame-Options: deny
basic_auth_users:
  prometheus: {HASH}
""",
    )
    cfg = webconfig.load(p)
    assert cfg.tls is not None and cfg.tls.client_auth_type == "RequireAndVerifyClientCert"
    ctx = cfg.ssl_context()
    assert ctx is not None
    assert cfg.users["prometheus"] == HASH.encode()
    assert cfg.headers == {"X-Frame-Options": "deny"}


def test_relative_paths_resolve_against_the_file(tmp_path: Path, exporter_pki: pki_mod.Pki) -> None:
    (tmp_path / "s.crt").write_bytes(exporter_pki.server_cert.read_bytes())
    (tmp_path / "s.key").write_bytes(exporter_pki.server_key.read_bytes())
    p = write(tmp_path, "tls_server_config:\n  cert_file: s.crt\n  key_file: s.key\n")
    assert webconfig.load(p).tls is not None


def test_empty_file_means_plain_http(tmp_path: Path) -> None:
    cfg = webconfig.load(write(tmp_path, ""))
    assert cfg.ssl_context() is None and cfg.authenticator() is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "tls_server_config: {cert_file: /nope.crt, key_file: /nope.key}\n",
            "tls_server_config.cert_file: /nope.crt does not exist",
        ),
        (  # a name the system will not look up (ENAMETOOLONG)
            f"tls_server_config: {{cert_file: /{'c' * 300}.crt, key_file: /nope.key}}\n",
            "tls_server_config.cert_file: /ccc",
        ),
        ("tls_server_config: {cert_file: x}\n", "tls_server_config.key_file: missing"),
        ("basic_auth_users:\n  alice: plaintext\n", "basic_auth_users.alice: expected a bcrypt hash"),
        (
            "tls_config: {}\n",
            "tls_config: unknown field; allowed here: basic_auth_users, http_server_config, tls_server_config",
        ),
        (
            "tls_server_config: {cipher_suites: [TLS_AES_128_GCM_SHA256]}\n",
            "tls_server_config.cipher_suites: not supported",
        ),
        (
            "http_server_config: {headers: {Content-Type: x}}\n",
            "http_server_config.headers.Content-Type: this header is set by the exporter",
        ),
        ("http_server_config: {colour: red}\n", "http_server_config.colour: unknown field"),
        ("basic_auth_users: [a, b]\n", "basic_auth_users: expected a mapping, got list"),
        ("tls_server_config: [\n", "web.yml:2: "),
        (
            f"basic_auth_users:\n  alice: '{HASH[:7]}{'A' * 53}'\n",  # right shape, unreadable salt
            "basic_auth_users.alice: expected a bcrypt hash",
        ),
        (f"basic_auth_users:\n  alice: '$2y$99${HASH[7:]}'\n", "basic_auth_users.alice: expected a bcrypt"),
        (
            'http_server_config: {headers: {"X-Evil\\r\\nSet-Cookie": a}}\n',
            "http_server_config.headers.'X-Evil\\r\\nSet-Cookie': not a header name",
        ),
        ('http_server_config: {headers: {"X Space": a}}\n', "headers.'X Space': not a header name"),
        ("- a\n", "top level: expected a mapping"),
    ],
    ids=lambda value: str(value).replace(HASH[7:], "<salt+hash>")[:40],  # stable ids for pytest-xdist
)
def test_bad_files_fail_with_one_line(tmp_path: Path, text: str, expected: str) -> None:
    assert expected in error_of(write(tmp_path, text))


def test_errors_name_the_line_of_the_field(tmp_path: Path) -> None:
    path = write(tmp_path, "# users\nbasic_auth_users:\n  bob: $2y$10$x\n  alice: plaintext\n")
    assert error_of(path) == (
        f"{path}:3: basic_auth_users.bob: expected a bcrypt hash ($2y$…, 60 characters), "
        "e.g. from htpasswd -nBC 10 USER"
    )
    path = write(tmp_path, "http_server_config:\n  headers:\n    X-Ok: a\n    Content-Type: x\n")
    assert error_of(path).startswith(f"{path}:4: http_server_config.headers.Content-Type: ")


def test_bad_tls_choices(tmp_path: Path, exporter_pki: pki_mod.Pki) -> None:
    base = f"tls_server_config:\n  cert_file: {exporter_pki.server_cert}\n  key_file: {exporter_pki.server_key}\n"
    msg = error_of(write(tmp_path, base + "  min_version: TLS14\n"))
    assert "tls_server_config.min_version: 'TLS14' is not one of TLS12, TLS13" in msg
    msg = error_of(write(tmp_path, base + "  client_auth_type: RequireAndVerifyClientCert\n"))
    assert "client_ca_file: required with client_auth_type RequireAndVerifyClientCert" in msg
    msg = error_of(write(tmp_path, base + f"  client_ca_file: {exporter_pki.ca_cert}\n"))
    assert "client_auth_type: client_ca_file is set but client_auth_type is NoClientCert" in msg
    msg = error_of(write(tmp_path, base + "  client_auth_type: RequireAnyClientCert\n"))
    assert "use VerifyClientCertIfGiven or RequireAndVerifyClientCert" in msg
    msg = error_of(write(tmp_path, base + "  min_version: TLS13\n  max_version: TLS12\n"))
    assert "tls_server_config.min_version: TLS13 is above max_version TLS12" in msg
    assert webconfig.load(write(tmp_path, base + "  min_version: TLS13\n  max_version: TLS13\n")).tls
    msg = error_of(write(tmp_path, base + "  client_auth_type: Sometimes\n"))
    assert "'Sometimes' is not one of" in msg


def test_mismatched_key_fails_at_load(tmp_path: Path, exporter_pki: pki_mod.Pki) -> None:
    p = write(
        tmp_path,
        f"tls_server_config:\n  cert_file: {exporter_pki.server_cert}\n  key_file: {exporter_pki.client_key}\n",
    )
    msg = error_of(p)
    assert "tls_server_config.cert_file/key_file: cannot load" in msg
    assert "matching private key" in msg


def test_garbage_ca_file_fails_at_load(tmp_path: Path, exporter_pki: pki_mod.Pki) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    p = write(
        tmp_path,
        f"tls_server_config:\n  cert_file: {exporter_pki.server_cert}\n  key_file: {exporter_pki.server_key}\n"
        f"  client_auth_type: VerifyClientCertIfGiven\n  client_ca_file: {junk}\n",
    )
    assert "tls_server_config.client_ca_file: cannot load" in error_of(p)


def test_missing_file(tmp_path: Path) -> None:
    msg = error_of(tmp_path / "absent.yml")
    assert "cannot read web config" in msg


def header(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_basic_auth_checks_and_caches_verdicts() -> None:
    auth = webconfig.BasicAuth({"prometheus": HASH.encode()})
    good = header("prometheus", "s3cret")
    assert auth.cached(good) is None
    assert auth.check(good)
    assert auth.cached(good) is True
    started = time.perf_counter()
    for _ in range(1000):
        assert auth.check(good)
    assert time.perf_counter() - started < 0.5  # no bcrypt per check once cached
    assert not auth.check(header("prometheus", "wrong"))
    assert not auth.check(header("mallory", "s3cret"))
    assert not auth.check("Bearer abc")
    assert not auth.check("Basic !!!notbase64")
    assert not auth.check(None)
    assert not auth.check("Basic " + base64.b64encode(b"no-colon").decode())
