"""The real kubectl as a client of ``gpupilot-adapter serve`` run as a process: a kubeconfig with the
test CA and a client certificate, ``kubectl version`` (/version), ``kubectl get --raw`` on discovery
and values, ``kubectl api-versions`` (the discovery walk); and SIGHUP reloading the config."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from devkit.pki import write_kubeconfig
from devkit.prometheus import free_port
from tests.adapter.conftest import PromEnv
from tests.support.adapter.pki import Pki

pytestmark = pytest.mark.usefixtures("kubectl_present")


@dataclass
class Served:
    port: int
    kubeconfig: Path
    config: Path
    proc: subprocess.Popen[bytes]
    log: Path


@pytest.fixture
def served_adapter(prom: PromEnv, pki: Pki, tmp_path: Path) -> Iterator[Served]:
    config = tmp_path / "adapter.yaml"
    config.write_text("metrics:\n  - name: DCGM_FI_DEV_GPU_UTIL\n")
    port = free_port()
    log = tmp_path / "adapter.log"
    cmd = [
        sys.executable,
        "-m",
        "adapter",
        "serve",
        "--prometheus-url",
        prom.url,
        "--config",
        str(config),
        "--secure-port",
        str(port),
        "--bind-address",
        "127.0.0.1",
        "--tls-cert-file",
        str(pki.server.cert),
        "--tls-private-key-file",
        str(pki.server.key),
        "--client-ca-file",
        str(pki.client_ca.path),
        "--requestheader-client-ca-file",
        str(pki.front_proxy_ca.path),
        "--requestheader-allowed-names",
        "front-proxy-client",
        "--authorization-mode",
        "none",
        "--pod-source",
        "prometheus",
        "--config-check-interval",
        "3600",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log.open("w"))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if requests.get(
                f"https://127.0.0.1:{port}/readyz", verify=str(pki.serving_ca.path), timeout=2
            ).ok:
                break
        except requests.RequestException:
            time.sleep(0.2)
    else:
        proc.kill()
        raise RuntimeError(f"adapter did not start: {log.read_text()[-500:]}")
    kubeconfig = write_kubeconfig(
        tmp_path / "kubeconfig",
        server=f"https://127.0.0.1:{port}",
        ca_cert=pki.serving_ca.path,
        client=pki.alice,
    )
    yield Served(port, kubeconfig, config, proc, log)
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


def kubectl(served_adapter: Served, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            "kubectl",
            "--kubeconfig",
            str(served_adapter.kubeconfig),
            "--cache-dir",
            str(served_adapter.kubeconfig.parent / "cache"),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.slow
def test_kubectl_version_and_raw_gets(served_adapter: Served) -> None:
    version = kubectl(served_adapter, "version", "-o", "json")
    assert version.returncode == 0, version.stderr
    assert json.loads(version.stdout)["serverVersion"]["gitVersion"].startswith("v1.37")

    disc = kubectl(served_adapter, "get", "--raw", "/apis/custom.metrics.k8s.io/v1beta2")
    assert disc.returncode == 0, disc.stderr
    assert "pods/DCGM_FI_DEV_GPU_UTIL" in {r["name"] for r in json.loads(disc.stdout)["resources"]}

    raw = kubectl(
        served_adapter,
        "get",
        "--raw",
        "/apis/custom.metrics.k8s.io/v1beta2/namespaces/ai-serving/pods/*/DCGM_FI_DEV_GPU_UTIL?labelSelector=app%3Dllm-inference",
    )
    assert raw.returncode == 0, raw.stderr
    items = json.loads(raw.stdout)["items"]
    assert {i["describedObject"]["name"]: i["value"] for i in items} == {
        "llm-inference-7d9f-a": "90",
        "llm-inference-7d9f-b": "80",
        "llm-inference-7d9f-c": "70",
    }

    missing = kubectl(
        served_adapter,
        "get",
        "--raw",
        "/apis/custom.metrics.k8s.io/v1beta2/namespaces/ai-serving/pods/*/nope",
    )
    assert missing.returncode != 0
    assert "could not find the metric nope" in missing.stderr or "NotFound" in missing.stderr


@pytest.mark.slow
def test_kubectl_discovery_walk(served_adapter: Served) -> None:
    # api-versions walks /api, /apis (aggregated-discovery request, plain fallback) and each group
    res = kubectl(served_adapter, "api-versions")
    assert res.returncode == 0, res.stderr
    assert {"custom.metrics.k8s.io/v1beta2", "custom.metrics.k8s.io/v1beta1"} <= set(res.stdout.split())
    # this config serves no external metric: the empty group is left out rather than break discovery
    assert "external.metrics.k8s.io/v1beta1" not in res.stdout.split()
    # api-resources hides sub-resource-like names (pods/X) but must not fail on our discovery
    assert kubectl(served_adapter, "api-resources", "--api-group=custom.metrics.k8s.io").returncode == 0


@pytest.mark.slow
def test_sighup_reloads_the_config(served_adapter: Served) -> None:
    served_adapter.config.write_text("metrics:\n  - name: gpu_busy\n    series: DCGM_FI_DEV_GPU_UTIL\n")
    served_adapter.proc.send_signal(signal.SIGHUP)
    path = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/ai-serving/pods/embedder-0/gpu_busy"
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        out = kubectl(served_adapter, "get", "--raw", path)
        if out.returncode == 0:
            break
        time.sleep(0.3)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["items"][0]["value"] == "30"
    assert served_adapter.proc.poll() is None  # still the same process
    assert "config reloaded" in served_adapter.log.read_text()
