"""Every read of the rightsizer bounded in time, headers included: a Prometheus or a Kubernetes API
that sends its answer a byte at a time is cut at the client's deadline (`plan --timeout`, the
kubeconfig client's request timeout), not held for as long as each byte comes within a read timeout;
`plan --timeout 1` against one ends in one line."""

from __future__ import annotations

import time
from pathlib import Path

import kubernetes
import pytest

from gpupilot_common import watchdog
from rightsizer.cli import main
from rightsizer.clients.kube import Kube, TemporaryKubeError
from rightsizer.clients.prometheus import PrometheusClient, PrometheusUnavailable
from rightsizer.commands import plan as plan_command  # imported now: the timing below is the command's
from tests.support.common.trickle import trickling

pytestmark = pytest.mark.slow  # each waits for a deadline


def test_a_trickling_prometheus_is_cut_at_the_timeout() -> None:
    with trickling() as url, PrometheusClient(url, timeout=1.0) as client:
        started = time.monotonic()
        with pytest.raises(PrometheusUnavailable, match=r"timed out after 1 s \(--timeout\)"):
            client.instant("up")
        assert time.monotonic() - started < 2.5  # the head alone takes 20 s at this pace


def test_plan_against_a_trickling_prometheus_ends_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert plan_command.__name__
    with trickling() as url:
        started = time.monotonic()
        code = main(["plan", "--prometheus-url", url, "--timeout", "1", "--out", str(tmp_path / "p.json")])
        took = time.monotonic() - started
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert code != 0 and took < 5, (code, took)
    assert len(errors) == 1 and "timed out after 1 s (--timeout)" in errors[0], errors


def test_a_trickling_kubernetes_api_is_cut_at_the_request_timeout() -> None:
    with trickling() as url:
        cfg = kubernetes.client.Configuration()
        cfg.host = url
        kube = Kube(kubernetes.client.ApiClient(cfg), request_timeout_s=1.0)
        cut = watchdog.WATCHDOG.expired
        for call in (lambda: kube.get_node("gpu-a"), kube.list_nodes):
            started = time.monotonic()
            with pytest.raises(
                TemporaryKubeError, match="no complete answer from the Kubernetes API within 1s"
            ):
                call()
            assert time.monotonic() - started < 2.5
        assert watchdog.WATCHDOG.expired >= cut + 2
        kube.close()


def test_a_trickling_node_watch_ends_at_its_deadline() -> None:
    with trickling() as url:
        cfg = kubernetes.client.Configuration()
        cfg.host = url
        kube = Kube(kubernetes.client.ApiClient(cfg), request_timeout_s=1.0)
        started = time.monotonic()
        try:
            events = list(kube.watch_node("gpu-a", resource_version="1", timeout_s=1.0))
        except TemporaryKubeError:
            events = []
        assert events == []
        assert time.monotonic() - started < 13.5  # the watch's own bound: its timeout + 10 s
        kube.close()
