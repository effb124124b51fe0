"""The adapter behind a tenant- and auth-checking gateway (tests/support/common/authproxy.py) in front of the
real Prometheus, under a path prefix: ``serve`` answers the HPA over https with a client
certificate, an X-Scope-OrgID and a bearer token rotated mid-run; ``explain-hpa`` with basic auth
(flags, and user:password@ in the URL); wrong credentials and bad files give one line; no secret
is ever printed or logged."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from adapter.cli import main
from adapter.config.settings import PrometheusSettings, ServeSettings
from adapter.serving.app import Adapter
from gpupilot_common.promauth import PrometheusAuth
from tests.adapter.conftest import Client, PromEnv, base_settings
from tests.support.adapter.pki import Pki
from tests.support.common.authproxy import AuthProxy, client_cert_context

SEED_HPA = Path(__file__).resolve().parents[3] / "examples" / "hpa-llm-inference.yaml"
PODS = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/ai-serving/pods/*/DCGM_FI_DEV_GPU_UTIL"
PASSWORD = "Pa55-w0rd-Secret"
TOKENS = ("tok-ONE-1a2b3c4d5e", "tok-TWO-6f7a8b9c0d")


def no_secret_in(*texts: str, secrets: tuple[str, ...]) -> None:
    for text in texts:
        for secret in secrets:
            assert secret not in text, f"a secret leaked into: {text[:300]}"


@pytest.mark.slow
def test_serve_through_tenant_gateway_with_client_cert_and_rotating_token(
    prom: PromEnv,
    pki: Pki,
    tmp_path: Path,
    start_adapter: Callable[[ServeSettings], Adapter],
    caplog: pytest.LogCaptureFixture,
) -> None:
    accepted = {TOKENS[0]}
    token = tmp_path / "token"
    token.write_text(TOKENS[0] + "\n")
    tls = client_cert_context(
        server_cert=str(pki.server.cert), server_key=str(pki.server.key), client_ca=str(pki.client_ca.path)
    )
    with (
        AuthProxy(prom.url, tokens=lambda: accepted, ssl_context=tls) as proxy,
        caplog.at_level(logging.DEBUG),
    ):
        auth = PrometheusAuth(
            tenant="team-gpu",
            bearer_token_file=token,
            ca_file=pki.serving_ca.path,
            cert_file=pki.alice.cert,
            key_file=pki.alice.key,
        )
        settings = base_settings(prom.url, pki, refresh_interval=0.5)
        adapter = start_adapter(
            ServeSettings(**{**settings.__dict__, "prometheus": PrometheusSettings(proxy.url, 3.0, auth)})
        )
        hpa = Client(f"https://127.0.0.1:{adapter.port}", pki)
        r = hpa.as_hpa(PODS, {"labelSelector": "app=llm-inference"})
        assert r.status_code == 200, r.text
        assert {i["describedObject"]["name"]: i["value"] for i in r.json()["items"]} == {
            "llm-inference-7d9f-a": "90",
            "llm-inference-7d9f-b": "80",
            "llm-inference-7d9f-c": "70",
        }
        # the kubelet rotates the projected token: a new file replaces the old one atomically
        accepted.clear()
        accepted.add(TOKENS[1])
        fresh = tmp_path / "token.new"
        fresh.write_text(TOKENS[1] + "\n")
        os.replace(fresh, token)
        rotated_at = len(proxy.seen)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(
            s.authorization == f"Bearer {TOKENS[1]}" for s in proxy.seen[rotated_at:]
        ):
            time.sleep(0.1)
        r = hpa.as_hpa(PODS, {"labelSelector": "app=llm-inference"})
        assert r.status_code == 200, r.text
        after = proxy.seen[rotated_at:]
        assert after and after[-1].authorization == f"Bearer {TOKENS[1]}"
        # every request carried the tenant and the client certificate, under the prefix
        assert {(s.tenant, s.client_cn) for s in proxy.seen} == {("team-gpu", "alice")}
        assert all(s.path.startswith("/prometheus/api/v1/") for s in proxy.seen)
        assert {s.path for s in proxy.seen} >= {
            "/prometheus/api/v1/query",
            "/prometheus/api/v1/label/__name__/values",
        }
        metrics = hpa.get("/metrics", cert=(pki.alice.cert, pki.alice.key)).text
    no_secret_in(caplog.text, r.text, metrics, secrets=TOKENS)


def test_explain_hpa_through_basic_auth_and_prefix(
    prom: PromEnv, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    password = tmp_path / "password"
    password.write_text(PASSWORD + "\n")
    with AuthProxy(prom.url, basic=("gpupilot", PASSWORD)) as proxy, caplog.at_level(logging.DEBUG):
        code = main(
            [
                "explain-hpa",
                "-f",
                str(SEED_HPA),
                "--prometheus-url",
                proxy.url,
                "--prometheus-tenant",
                "team-gpu",
                "--prometheus-username",
                "gpupilot",
                "--prometheus-password-file",
                str(password),
            ]
        )
        out, err = capsys.readouterr()
        assert code == 0, err
        assert "FINAL: 3 → 4 replicas (scale up)" in out
        assert f"values from {proxy.url}," in out
        assert {s.tenant for s in proxy.seen} == {"team-gpu"}
        # user:password@ in the URL works too, and is never shown
        with_userinfo = proxy.url.replace("http://", f"http://gpupilot:{PASSWORD}@")
        code = main(
            [
                "explain-hpa",
                "-f",
                str(SEED_HPA),
                "--prometheus-url",
                with_userinfo,
                "--prometheus-tenant",
                "team-gpu",
            ]
        )
        out2, err2 = capsys.readouterr()
        assert code == 0, err2
        assert f"values from {proxy.url}," in out2
    no_secret_in(out, err, out2, err2, caplog.text, secrets=(PASSWORD,))


@pytest.mark.parametrize(
    ("tenant", "password", "expected"),
    [
        (
            "team-gpu",
            "wrong-password-xyz",
            "answered HTTP 401 for /api/v1/query (invalid username or password); not authenticated: check --prometheus-username/--prometheus-password-file",
        ),
        ("", PASSWORD, "answered HTTP 401 for /api/v1/query (no org id); not authenticated"),
        (
            "team-other",
            PASSWORD,
            "answered HTTP 403 for /api/v1/query (tenant team-other is not allowed for these credentials); forbidden: the credentials are valid but may not read this tenant or path; check --prometheus-tenant",
        ),
    ],
)
def test_explain_hpa_refused_is_one_line(
    prom: PromEnv,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    tenant: str,
    password: str,
    expected: str,
) -> None:
    pw = tmp_path / "password"
    pw.write_text(password)
    argv = [
        "explain-hpa",
        "-f",
        str(SEED_HPA),
        "--prometheus-username",
        "gpupilot",
        "--prometheus-password-file",
        str(pw),
    ]
    argv += ["--prometheus-tenant", tenant] if tenant else []
    with AuthProxy(prom.url, basic=("gpupilot", PASSWORD)) as proxy, caplog.at_level(logging.DEBUG):
        code = main([*argv, "--prometheus-url", proxy.url])
        out, err = capsys.readouterr()
    assert code == 1
    assert out == ""
    assert err.count("\n") == 1 and err.startswith(
        f"gpupilot-adapter explain-hpa: Prometheus at {proxy.url} "
    ), err
    assert expected in err, err
    assert len(proxy.seen) == 1  # stopped at the first refusal
    no_secret_in(out, err, caplog.text, secrets=(PASSWORD, password))


def test_client_without_certificate_is_one_line(
    prom: PromEnv, pki: Pki, capsys: pytest.CaptureFixture[str]
) -> None:
    tls = client_cert_context(
        server_cert=str(pki.server.cert), server_key=str(pki.server.key), client_ca=str(pki.client_ca.path)
    )
    with AuthProxy(prom.url, tokens=lambda: {TOKENS[0]}, ssl_context=tls) as proxy:
        code = main(
            [
                "explain-hpa", "-f", str(SEED_HPA), "--no-history",
                "--prometheus-url", proxy.url,
                "--prometheus-ca-file", str(pki.serving_ca.path),
                "--prometheus-tenant", "team-gpu",
            ]
        )  # fmt: skip
    _, err = capsys.readouterr()
    assert code == 1
    assert err.count("\n") == 1 and f"Prometheus at {proxy.url}" in err, err
    assert "--prometheus-cert-file" in err, err


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (
            ["--prometheus-bearer-token-file", "/nonexistent/token"],
            "argument --prometheus-bearer-token-file: '/nonexistent/token': no such file",
        ),
        (["--prometheus-key-file", "KEY"], "--prometheus-key-file KEY needs --prometheus-cert-file"),
        (["--prometheus-ca-file", "GARBAGE"], "--prometheus-ca-file GARBAGE: no PEM certificate in it"),
        (["--prometheus-tenant", "a/b"], "--prometheus-tenant 'a/b': a tenant ID is 1-150 of"),
        (["--prometheus-password-file", "KEY"], "--prometheus-password-file needs --prometheus-username"),
    ],
)
@pytest.mark.parametrize("command", ["serve", "explain-hpa"])
def test_bad_settings_and_files_are_one_line(
    command: str, flags: list[str], expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "garbage.pem").write_text("-----BEGIN NOTHING-----\n")
    (tmp_path / "key.pem").write_text("not a key\n")
    subst = {"KEY": str(tmp_path / "key.pem"), "GARBAGE": str(tmp_path / "garbage.pem")}
    flags = [subst.get(f, f) for f in flags]
    expected = expected.replace("KEY", subst["KEY"]).replace("GARBAGE", subst["GARBAGE"])
    argv = [command, "--prometheus-url", "http://127.0.0.1:9/prometheus", *flags]
    if command == "explain-hpa":
        argv += ["-f", str(SEED_HPA)]
    else:
        argv += [
            "--self-signed-cert-dir",
            str(tmp_path / "tls"),
            "--pod-source",
            "none",
            "--authorization-mode",
            "none",
        ]
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own checks (a missing file)
        code = int(exc.code or 0)
    _, err = capsys.readouterr()
    assert code == 2
    assert err.count("\n") == 1 and expected in err, err


def test_replay_hpa_through_the_gateway_and_refused(
    prom: PromEnv, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    token = tmp_path / "token"
    token.write_text(TOKENS[0])
    with AuthProxy(prom.url, tokens=lambda: {TOKENS[0]}) as proxy:
        argv = [
            "replay-hpa",
            "-f",
            str(SEED_HPA),
            "--prometheus-url",
            proxy.url,
            "--since",
            "10m",
            "--rows",
            "3",
        ]
        argv += ["--prometheus-bearer-token-file", str(token)]
        code = main([*argv, "--prometheus-tenant", "team-gpu"])
        out, err = capsys.readouterr()
        assert code == 0, err
        assert "41 steps of 15s" in out
        assert {s.tenant for s in proxy.seen} == {"team-gpu"}
        seen = len(proxy.seen)
        code = main([*argv, "--prometheus-tenant", "team-other"])
        out2, err2 = capsys.readouterr()
    assert code == 1 and out2 == ""
    assert err2.count("\n") == 1 and "answered HTTP 403 for /api/v1/query" in err2, err2
    assert len(proxy.seen) == seen + 1
    no_secret_in(out, err, out2, err2, secrets=TOKENS)
