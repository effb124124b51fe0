"""gpupilot_common.promauth and .credentials: the shared tenant/credential/TLS settings — secret files re-read when the
kubelet swaps them, one-line errors naming flag and file, headers sent, secrets scrubbed, and the
same flags and help text in the adapter and the rightsizer."""

from __future__ import annotations

import argparse
import base64
import logging
import os
import re
from pathlib import Path

import pytest

from adapter import cli as adapter_cli
from devkit.pki import make_ca
from gpupilot_common.credentials import MAX_SECRET_BYTES, Credentials, SecretFile
from gpupilot_common.promauth import CredentialError, PrometheusAuth
from gpupilot_common.urls import base_url
from rightsizer import cli as rightsizer_cli


def kubelet_projected(folder: Path, token: str, generation: int) -> Path:
    """Write ``token`` as the kubelet's atomic writer does: a timestamped folder, ``..data`` a
    symlink to it swapped by rename, ``token`` a symlink to ``..data/token``."""
    gen = folder / f"..2026_11_30_{generation}"
    gen.mkdir()
    (gen / "token").write_text(token)
    tmp = folder / "..data_tmp"
    tmp.symlink_to(gen.name)
    os.replace(tmp, folder / "..data")
    link = folder / "token"
    if not link.is_symlink():
        link.symlink_to("..data/token")
    return link


def test_projected_token_is_reread_after_the_kubelet_swaps_it(tmp_path: Path) -> None:
    path = kubelet_projected(tmp_path, "first-token-aaaa\n", 1)
    secret = SecretFile(path, flag="--prometheus-bearer-token-file")
    assert secret.read() == "first-token-aaaa"
    kubelet_projected(tmp_path, "second-token-bbbb\n", 2)
    assert secret.read() == "second-token-bbbb"
    assert secret.read() == "second-token-bbbb"  # unchanged file: the cached value


def test_token_rewritten_in_place_is_reread(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("aaaa-one")
    secret = SecretFile(path, flag="--prometheus-bearer-token-file")
    assert secret.read() == "aaaa-one"
    path.write_text("bbbb-two-longer")
    assert secret.read() == "bbbb-two-longer"


def test_a_token_that_disappears_keeps_the_previous_one_and_warns_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "token"
    path.write_text("still-valid-secret")
    secret = SecretFile(path, flag="--prometheus-bearer-token-file")
    path.unlink()
    with caplog.at_level(logging.WARNING):
        assert secret.read() == "still-valid-secret"
        assert secret.read() == "still-valid-secret"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert f"--prometheus-bearer-token-file {path}: cannot read" in warnings[0]
    assert "still-valid-secret" not in caplog.text
    path.write_text("the-new-secret")
    assert secret.read() == "the-new-secret"


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"", "the file is empty"),
        (b"  \n", "the file is empty"),
        (b"line-one\nline-two\n", "holds more than one line"),
        (b"\xff\xfe\x00", "not UTF-8 text"),
        (b"x" * (MAX_SECRET_BYTES + 1), "not a secret"),
    ],
)
def test_bad_secret_files_are_one_line(tmp_path: Path, content: bytes, problem: str) -> None:
    path = tmp_path / "token"
    path.write_bytes(content)
    with pytest.raises(CredentialError) as err:
        SecretFile(path, flag="--prometheus-password-file")
    text = str(err.value)
    assert text.startswith(f"--prometheus-password-file {path}: ") and problem in text
    assert "\n" not in text and "line-one" not in text


def test_a_folder_given_as_token_file(tmp_path: Path) -> None:
    with pytest.raises(CredentialError, match=rf"--prometheus-bearer-token-file {tmp_path}: cannot read"):
        SecretFile(tmp_path, flag="--prometheus-bearer-token-file")


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (dict(tenant="team a"), "--prometheus-tenant 'team a': a tenant ID is 1-150 of"),
        (dict(tenant=".."), "not '.' or '..'"),
        (dict(tenant="a" * 151), "a tenant ID is 1-150"),
        (dict(tenant_header="X Bad"), "--prometheus-tenant-header 'X Bad' is not an HTTP header name"),
        (dict(username="u"), "--prometheus-username needs --prometheus-password-file"),
        (dict(password_file=Path("p")), "--prometheus-password-file needs --prometheus-username"),
        (dict(username="a:b", password_file=Path("p")), "cannot contain ':'"),
        (
            dict(username="u", password_file=Path("p"), bearer_token_file=Path("t")),
            "both set the Authorization header; give one",
        ),
        (dict(key_file=Path("k.pem")), "--prometheus-key-file k.pem needs --prometheus-cert-file"),
    ],
)
def test_settings_that_cannot_work_together(settings: dict[str, object], message: str) -> None:
    with pytest.raises(CredentialError, match=re.escape(message)):
        PrometheusAuth(**settings).check()  # type: ignore[arg-type]


def test_config_file_names_in_messages() -> None:
    with pytest.raises(CredentialError, match=r"^prometheus_key_file k\.pem needs prometheus_cert_file"):
        PrometheusAuth(key_file=Path("k.pem")).check(field="prometheus_")


def test_several_tenants_joined_by_a_pipe_are_allowed() -> None:
    PrometheusAuth(tenant="team-gpu|team-ml").check()


def test_headers_tenant_basic_and_bearer(tmp_path: Path) -> None:
    (tmp_path / "pw").write_text("pa55-word\n")
    (tmp_path / "tok").write_text("tok-123456")
    basic = Credentials(PrometheusAuth(tenant="team-gpu", username="gpupilot", password_file=tmp_path / "pw"))
    pair = base64.b64encode(b"gpupilot:pa55-word").decode()
    assert basic.headers() == {"X-Scope-OrgID": "team-gpu", "Authorization": f"Basic {pair}"}
    bearer = Credentials(
        PrometheusAuth(tenant="t1", tenant_header="THANOS-TENANT", bearer_token_file=tmp_path / "tok")
    )
    assert bearer.headers() == {"THANOS-TENANT": "t1", "Authorization": "Bearer tok-123456"}
    url_basic = Credentials(PrometheusAuth(), userinfo=("admin", "s3cret"))
    assert url_basic.headers() == {"Authorization": "Basic " + base64.b64encode(b"admin:s3cret").decode()}
    assert Credentials(PrometheusAuth()).headers() == {}


def test_credentials_given_twice(tmp_path: Path) -> None:
    (tmp_path / "tok").write_text("tok-123456")
    with pytest.raises(CredentialError, match="carries user:password@ and"):
        Credentials(PrometheusAuth(bearer_token_file=tmp_path / "tok"), userinfo=("a", "b"))


def test_scrub_removes_every_secret_form(tmp_path: Path) -> None:
    (tmp_path / "pw").write_text("pa55-word")
    creds = Credentials(PrometheusAuth(username="gpupilot", password_file=tmp_path / "pw"))
    encoded = base64.b64encode(b"gpupilot:pa55-word").decode()
    echoed = f"bad password pa55-word (header Basic {encoded})"
    assert creds.scrub(echoed) == "bad password *** (header Basic ***)"


@pytest.mark.slow
def test_tls_files_checked_at_start(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    with pytest.raises(CredentialError) as err:
        Credentials(PrometheusAuth(ca_file=garbage))
    assert (
        str(err.value)
        == f"--prometheus-ca-file {garbage}: no PEM certificate in it; give the CA bundle (PEM)"
    )
    with pytest.raises(CredentialError, match=rf"^--prometheus-ca-file {tmp_path}: cannot read"):
        Credentials(PrometheusAuth(ca_file=tmp_path))
    ca = make_ca(tmp_path, "ca")
    me = ca.issue(tmp_path, cn="gpupilot")
    other = ca.issue(tmp_path, cn="other")
    # a certificate without its key
    with pytest.raises(CredentialError) as err:
        Credentials(PrometheusAuth(cert_file=me.cert))
    assert str(err.value) == (
        f"--prometheus-cert-file {me.cert}: not a PEM certificate and its matching private key "
        "(give the key with --prometheus-key-file)"
    )
    # a key that belongs to another certificate
    with pytest.raises(CredentialError, match=r"/ --prometheus-key-file .*other.key: not a PEM certificate"):
        Credentials(PrometheusAuth(cert_file=me.cert, key_file=other.key))
    good = Credentials(PrometheusAuth(ca_file=ca.path, cert_file=me.cert, key_file=me.key))
    assert good.ssl_context is not None
    combined = tmp_path / "combined.pem"
    combined.write_bytes(me.cert.read_bytes() + me.key.read_bytes())
    assert Credentials(PrometheusAuth(cert_file=combined)).ssl_context is not None


def test_a_prefix_goes_in_the_url_not_a_query() -> None:
    assert base_url("https://mimir.example/prometheus") == "https://mimir.example/prometheus"
    with pytest.raises(argparse.ArgumentTypeError, match="no \\?query or #fragment"):
        base_url("http://admin:s3cret@mimir:8080/prometheus?orgId=1")
    with pytest.raises(argparse.ArgumentTypeError) as err:
        base_url("http://admin:s3cret@mimir:8080/?x=1")
    assert "s3cret" not in str(err.value)


def _auth_help(parser: argparse.ArgumentParser, command: str) -> str:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    out = sub.choices[command].format_help()
    start = out.index("Prometheus tenant, credentials and TLS:")
    rest = out[start:]
    end = re.search(r"\n\n(?! )", rest)
    return str(rest[: end.start()] if end else rest)


@pytest.mark.slow
def test_adapter_and_rightsizer_have_the_same_flags_and_help(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "120")
    adapter = _auth_help(adapter_cli.build_parser(), "serve")
    assert "--prometheus-tenant ID" in adapter and "--prometheus-bearer-token-file FILE" in adapter
    assert "--prometheus-key-file FILE" in adapter
    assert "--prometheus-password " not in adapter  # no password on the command line
    for command in ("explain-hpa", "replay-hpa"):
        assert _auth_help(adapter_cli.build_parser(), command) == adapter, command
    for command in ("plan", "report"):
        assert _auth_help(rightsizer_cli.build_parser([command]), command) == adapter, command
