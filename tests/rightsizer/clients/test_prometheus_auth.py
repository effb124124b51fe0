"""The rightsizer behind a tenant- and auth-checking gateway (tests/support/common/authproxy.py) in front of a
real Prometheus holding the small known history, under a path prefix: ``plan`` over https with a
client certificate, X-Scope-OrgID and a bearer token rotated in the middle of the run; basic auth
in the URL redacted in plan.json; serve's config takes the same settings; wrong credentials and
bad files give one line; no secret is printed, logged or written."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from devkit.pki import CA, Issued, make_ca
from devkit.prometheus import PrometheusServer
from gpupilot_common.promauth import PrometheusAuth
from rightsizer.cli import main
from rightsizer.commands.serve import LiveJobs
from rightsizer.plan.model import load_plan
from rightsizer.serve.config import PlanJob, ServeConfigError, parse
from tests.support.common.authproxy import AuthProxy, client_cert_context
from tests.support.rightsizer.small_history import DAYS, shared_blocks

pytestmark = pytest.mark.prometheus
TOKENS = ("tok-ONE-1a2b3c4d5e", "tok-TWO-6f7a8b9c0d")
PASSWORD = "Pa55-w0rd-Secret"


@dataclass(frozen=True)
class Env:
    url: str
    end: float
    ca: CA
    server: Issued
    client: Issued
    client_ca: CA


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    base = tmp_path_factory.mktemp("rightsizer-auth")
    _, end = shared_blocks(tmp_path_factory, base / "data")
    ca, client_ca = make_ca(base, "serving-ca"), make_ca(base, "client-ca")
    server = ca.issue(base, cn="mimir-gateway", server=True)
    client = client_ca.issue(base, cn="gpupilot-rightsizer")
    with PrometheusServer(base / "data", log_file=base / "prometheus.log") as prom:
        yield Env(prom.url, end, ca, server, client, client_ca)


def tls(env: Env) -> object:
    return client_cert_context(
        server_cert=str(env.server.cert), server_key=str(env.server.key), client_ca=str(env.client_ca.path)
    )


def plan_args(env: Env, url: str, out: Path) -> list[str]:
    return ["plan", "--prometheus-url", url, "--window", f"{DAYS}d", "--at", str(env.end), "--out", str(out)]


def test_plan_through_gateway_with_client_cert_tenant_and_token_rotated_mid_run(
    env: Env, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    accepted = {TOKENS[0]}
    token = tmp_path / "token"
    token.write_text(TOKENS[0])

    def rotate(count: int) -> None:
        """The kubelet swaps the projected token while plan is querying; the old one stays valid a
        little longer (as a rotated service-account token does), then is refused."""
        if count == 5:
            fresh = tmp_path / "token.new"
            fresh.write_text(TOKENS[1])
            os.replace(fresh, token)
            accepted.add(TOKENS[1])
        if count == 7:
            accepted.discard(TOKENS[0])

    out = tmp_path / "plan.json"
    with (
        AuthProxy(env.url, tokens=lambda: accepted, ssl_context=tls(env), on_request=rotate) as proxy,  # type: ignore[arg-type]
        caplog.at_level(logging.DEBUG),
    ):
        code = main(
            [
                *plan_args(env, proxy.url, out),
                "--prometheus-tenant", "team-gpu",
                "--prometheus-bearer-token-file", str(token),
                "--prometheus-ca-file", str(env.ca.path),
                "--prometheus-cert-file", str(env.client.cert),
                "--prometheus-key-file", str(env.client.key),
            ]
        )  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    plan = load_plan(out)
    node = plan.node("node-a")
    assert node is not None and node.gpus_freed == 1  # the same answer as without the gateway
    assert plan.prometheus_url == proxy.url
    assert len(proxy.seen) > 10
    assert {(s.tenant, s.client_cn) for s in proxy.seen} == {("team-gpu", "gpupilot-rightsizer")}
    assert all(s.path.startswith("/prometheus/api/v1/") for s in proxy.seen)
    tokens = [s.authorization for s in proxy.seen]
    assert set(tokens[:5]) == {f"Bearer {TOKENS[0]}"} and set(tokens[7:]) == {f"Bearer {TOKENS[1]}"}
    texts = (captured.out, captured.err, out.read_text(), caplog.text)
    assert not [t for t in texts for secret in TOKENS if secret in t]


def test_basic_auth_in_the_url_is_redacted_everywhere(
    env: Env, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "plan.json"
    with AuthProxy(env.url, basic=("gpupilot", PASSWORD)) as proxy, caplog.at_level(logging.DEBUG):
        url = proxy.url.replace("http://", f"http://gpupilot:{PASSWORD}@")
        code = main([*plan_args(env, url, out), "--prometheus-tenant", "team-gpu"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert load_plan(out).prometheus_url == proxy.url
    for text in (captured.out, captured.err, out.read_text(), caplog.text):
        assert PASSWORD not in text


@pytest.mark.parametrize(
    ("token", "tenant", "expected"),
    [
        (
            "tok-WRONG-000000",
            "team-gpu",
            "answered HTTP 401 for /api/v1/query (invalid or expired bearer token); not authenticated: "
            "check --prometheus-username/--prometheus-password-file, --prometheus-bearer-token-file",
        ),
        (
            TOKENS[0],
            "team-other",
            "answered HTTP 403 for /api/v1/query (tenant team-other is not allowed",
        ),
    ],
)
def test_refused_credentials_are_one_line(
    env: Env,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    token: str,
    tenant: str,
    expected: str,
) -> None:
    (tmp_path / "token").write_text(token)
    out = tmp_path / "plan.json"
    with AuthProxy(env.url, tokens=lambda: {TOKENS[0]}) as proxy, caplog.at_level(logging.DEBUG):
        argv = [*plan_args(env, proxy.url, out), "--prometheus-tenant", tenant]
        code = main([*argv, "--prometheus-bearer-token-file", str(tmp_path / "token")])
    err = capsys.readouterr().err
    assert code == 1
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"error: Prometheus at {proxy.url} ") and expected in last, err
    assert len(proxy.seen) == 1 and not out.exists()
    assert token not in err and token not in caplog.text


def test_a_client_without_certificate_is_told_what_to_check(
    env: Env, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with AuthProxy(env.url, tokens=lambda: {TOKENS[0]}, ssl_context=tls(env)) as proxy:  # type: ignore[arg-type]
        code = main(
            [*plan_args(env, proxy.url, tmp_path / "p.json"), "--prometheus-ca-file", str(env.ca.path)]
        )
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 1
    assert last == (
        f"error: Prometheus at {proxy.url}: the server closed the connection without an answer; if it requires "
        "a client certificate, check --prometheus-cert-file/--prometheus-key-file (issued by a CA it trusts)"
    )


def test_a_server_from_another_ca_is_a_tls_failure(
    env: Env, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = make_ca(tmp_path, "other-ca")
    with AuthProxy(env.url, tokens=lambda: {TOKENS[0]}, ssl_context=tls(env)) as proxy:  # type: ignore[arg-type]
        code = main(
            [*plan_args(env, proxy.url, tmp_path / "p.json"), "--prometheus-ca-file", str(other.path)]
        )
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 1
    assert last.startswith(
        f"error: Prometheus at {proxy.url}: TLS handshake failed (certificate verify failed)"
    )
    assert "check --prometheus-ca-file" in last


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (
            ["--prometheus-bearer-token-file", "/nonexistent/token"],
            "argument --prometheus-bearer-token-file: '/nonexistent/token': no such file",
        ),
        (["--prometheus-key-file", "KEY"], "error: --prometheus-key-file KEY needs --prometheus-cert-file"),
        (["--prometheus-ca-file", "KEY"], "error: --prometheus-ca-file KEY: no PEM certificate in it"),
        (
            ["--prometheus-cert-file", "KEY"],
            "error: --prometheus-cert-file KEY: not a PEM certificate and its matching private key",
        ),
        (["--prometheus-username", "u"], "error: --prometheus-username needs --prometheus-password-file"),
    ],
)
@pytest.mark.parametrize("command", ["plan", "report"])
def test_bad_settings_and_files_are_one_line(
    command: str, flags: list[str], expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = tmp_path / "key.pem"
    key.write_text("not a key\n")
    flags = [str(key) if f == "KEY" else f for f in flags]
    argv = [
        command,
        "--prometheus-url",
        "http://127.0.0.1:9/prometheus",
        "--out",
        str(tmp_path / "o"),
        *flags,
    ]
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own checks (a missing file)
        code = int(exc.code or 0)
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and expected.replace("KEY", str(key)) in err, err


def test_serve_config_takes_the_same_settings_and_plans_through_the_gateway(env: Env, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(TOKENS[0])
    doc = {
        "prometheus_url": "https://127.0.0.1:1/prometheus",
        "prometheus_tenant": "team-gpu",
        "prometheus_bearer_token_file": str(token),
        "prometheus_ca_file": str(env.ca.path),
        "prometheus_cert_file": str(env.client.cert),
        "prometheus_key_file": str(env.client.key),
        "timezone": "UTC",
        "state_dir": str(tmp_path / "state"),
        "plan": {"every": "6h", "window": f"{DAYS}d"},
    }
    assert parse(doc, source="serve.yaml").prometheus_auth == PrometheusAuth(
        tenant="team-gpu",
        bearer_token_file=token,
        ca_file=env.ca.path,
        cert_file=env.client.cert,
        key_file=env.client.key,
    )
    with AuthProxy(env.url, tokens=lambda: {TOKENS[0]}, ssl_context=tls(env)) as proxy:  # type: ignore[arg-type]
        config = parse({**doc, "prometheus_url": proxy.url}, source="serve.yaml")
        plan = LiveJobs(config).make_plan(end=env.end, job=PlanJob(window_s=DAYS * 86400.0))
    assert plan.node("node-a") is not None and plan.node("node-a").gpus_freed == 1  # type: ignore[union-attr]
    assert {(s.tenant, s.client_cn) for s in proxy.seen} == {("team-gpu", "gpupilot-rightsizer")}
    assert TOKENS[0] not in (tmp_path / "state" / "plan.json").read_text()


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (
            {"prometheus_bearer_token_file": "/nonexistent/t"},
            "serve.yaml: prometheus_bearer_token_file: '/nonexistent/t': no such file",
        ),
        ({"prometheus_key_file": "KEY"}, "serve.yaml: prometheus_key_file: KEY needs prometheus_cert_file"),
        ({"prometheus_tenant": "a b"}, "serve.yaml: prometheus_tenant: 'a b': a tenant ID is 1-150 of"),
        ({"prometheus_password": "x"}, "serve.yaml: prometheus_password: unknown field"),
    ],
)
def test_serve_config_bad_settings_name_the_field(
    tmp_path: Path, extra: dict[str, str], expected: str
) -> None:
    key = tmp_path / "key.pem"
    key.write_text("k")
    extra = {k: (str(key) if v == "KEY" else v) for k, v in extra.items()}
    doc = {"prometheus_url": "http://p:9090", "timezone": "UTC", "plan": {"every": "6h"}, **extra}
    with pytest.raises(ServeConfigError) as err:
        parse(doc, source="serve.yaml")
    assert expected.replace("KEY", str(key)) in str(err.value)
