"""Timeouts that mean what they say: a Prometheus that trickles its answer one byte at a time is cut
at --prometheus-timeout (one deadline for connect and read), and every interval flag refuses 0,
negative, NaN and infinite values with one line."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from adapter.cli import main
from adapter.clients.kube import KubeClient
from adapter.clients.prometheus import PrometheusClient
from adapter.errors import KubernetesUnavailable, PrometheusUnavailable
from tests.support.common.trickle import trickling


@pytest.fixture
def trickling_server() -> Iterator[str]:
    """Answers every connection with a valid HTTP head, one byte every 0.2 s (never finishing in time)."""
    with trickling() as url:
        yield url


@pytest.mark.slow
def test_a_trickling_prometheus_is_cut_at_the_deadline(trickling_server: str) -> None:
    client = PrometheusClient(trickling_server, timeout=1.0)
    try:
        started = time.monotonic()
        with pytest.raises(
            PrometheusUnavailable, match=r"no complete answer, timed out after 1 s \(--prometheus-timeout\)"
        ):
            client.query("up")
        elapsed = time.monotonic() - started
        assert 0.9 < elapsed < 1.8  # a per-read timeout would wait for all ~200 bytes: 40 s
        assert client.scrape_interval() is None  # the same deadline; None = use the default
    finally:
        client.close()


@pytest.mark.slow
def test_a_trickling_kubernetes_api_is_cut_at_the_deadline(trickling_server: str, tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": trickling_server}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    kube = KubeClient(kubeconfig=str(kubeconfig), timeout=1.0)
    try:
        for call, what in (
            (lambda: kube.token_review("some-token"), "TokenReview"),
            (
                lambda: kube.subject_access_review(
                    user="u", groups=(), extra={}, uid="", resource={"verb": "get"}, non_resource=None
                ),
                "SubjectAccessReview",
            ),
            (kube.list_pods, "listing pods"),
        ):
            started = time.monotonic()
            with pytest.raises(KubernetesUnavailable, match=f"{what}.*within 1s"):
                call()
            assert time.monotonic() - started < 1.8
    finally:
        kube.close()


@pytest.mark.parametrize(
    "flag",
    [
        "--discovery-interval",
        "--prometheus-timeout",
        "--refresh-interval",
        "--refresh-idle-timeout",
        "--config-check-interval",
        "--auth-cache-ttl",
        "--pod-cache-seconds",
        "--idle-connection-timeout",
        "--tls-handshake-timeout",
        "--kube-api-timeout",
    ],
)
@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "soon"])
def test_interval_flags_refuse_values_that_would_spin_or_never_fire(
    flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--prometheus-url", "http://127.0.0.1:1", flag, value])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"gpupilot-adapter serve: error: argument {flag}: ")
    assert "Traceback" not in "".join(err)


@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_max_value_age_allows_zero_but_not_nonsense(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--prometheus-url", "http://127.0.0.1:1", "--max-value-age", value])
    assert "argument --max-value-age" in capsys.readouterr().err
