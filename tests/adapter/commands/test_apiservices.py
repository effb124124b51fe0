"""APIService coexistence: gpupilot must not silently take custom.metrics.k8s.io from another
adapter (prometheus-adapter's APIServices have the same names). The check command runs against the
API double over real HTTP through the official client."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from adapter.cli import main
from adapter.commands import check_apiservices as apiservice_check
from adapter.config import apiservices
from tests.support.kubedouble import KubeDouble


def apiservice(
    name: str, *, namespace: str | None, service: str | None, priority: int = 100
) -> dict[str, Any]:
    version, group = name.split(".", 1)
    spec: dict[str, Any] = {
        "group": group,
        "version": version,
        "groupPriorityMinimum": 100,
        "versionPriority": priority,
    }
    if service is not None:
        spec["service"] = {"namespace": namespace, "name": service, "port": 443}
    return {
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": {"name": name},
        "spec": spec,
    }


PROM_ADAPTER = apiservice(
    "v1beta1.custom.metrics.k8s.io", namespace="monitoring", service="prometheus-adapter"
)


def test_a_foreign_v1beta1_blocks_the_whole_group_even_with_v1beta2_free():
    found = apiservices.findings(
        {"v1beta2.custom.metrics.k8s.io": None, "v1beta1.custom.metrics.k8s.io": PROM_ADAPTER},
        namespace="gpupilot",
        service="gpupilot-adapter",
    )
    assert [(f.state, f.served_by) for f in found] == [
        ("absent", "-"),
        ("foreign", "monitoring/prometheus-adapter"),
    ]
    (line,) = apiservices.conflicts(found)
    assert line.startswith("custom.metrics.k8s.io is served by monitoring/prometheus-adapter")
    assert "404" in line and "--take-over" in line


def test_ours_and_absent_are_no_conflict_and_local_is_foreign():
    ours = apiservice("v1beta1.custom.metrics.k8s.io", namespace="gpupilot", service="gpupilot-adapter")
    local = apiservice("v1beta1.external.metrics.k8s.io", namespace=None, service=None)
    found = apiservices.findings(
        {"v1beta1.custom.metrics.k8s.io": ours, "v1beta2.custom.metrics.k8s.io": None},
        namespace="gpupilot",
        service="gpupilot-adapter",
    )
    assert apiservices.conflicts(found) == []
    (f,) = apiservices.findings({"v1beta1.external.metrics.k8s.io": local}, namespace="gpupilot", service="x")
    assert (f.state, f.served_by) == ("foreign", "local")


def test_names_match_what_deploy_installs():
    import yaml  # noqa: PLC0415

    root = Path(__file__).resolve().parents[3] / "deploy" / "adapter"
    installed = [d["metadata"]["name"] for d in yaml.safe_load_all((root / "apiservice.yaml").read_text())]
    external = [
        d["metadata"]["name"] for d in yaml.safe_load_all((root / "external" / "apiservice.yaml").read_text())
    ]
    assert apiservices.apiservice_names(external=False) == installed
    assert apiservices.apiservice_names(external=True) == installed + external


@pytest.fixture
def kube_and_kubeconfig(tmp_path: Path):
    """The API double without a MIG Manager, and a kubeconfig for it."""
    with KubeDouble(run_mig_manager=False) as k:
        yield k, k.write_kubeconfig(tmp_path / "kubeconfig")


def run(argv: list[str], capsys) -> tuple[int, str]:
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out + out.err


@pytest.mark.slow
def test_check_refuses_to_take_over_prometheus_adapter(kube_and_kubeconfig, capsys):
    k, cfg = kube_and_kubeconfig
    k.store.put("apiregistration.k8s.io/apiservices", PROM_ADAPTER, event="ADDED")
    code, text = run(["check-apiservices", "--kubeconfig", str(cfg)], capsys)
    assert code == 1
    assert "v1beta1.custom.metrics.k8s.io  monitoring/prometheus-adapter  foreign" in text
    assert "REFUSED: custom.metrics.k8s.io is served by monitoring/prometheus-adapter" in text
    code, text = run(["check-apiservices", "--kubeconfig", str(cfg), "--take-over"], capsys)
    assert code == 0 and "taking over (--take-over)" in text


@pytest.mark.slow
def test_check_passes_on_a_free_or_own_cluster(kube_and_kubeconfig, capsys):
    k, cfg = kube_and_kubeconfig
    code, text = run(["check-apiservices", "--kubeconfig", str(cfg), "--external"], capsys)
    assert code == 0 and "OK" in text and text.count("absent") == 3
    for name in apiservices.apiservice_names(external=False):
        k.store.put(
            "apiregistration.k8s.io/apiservices",
            apiservice(name, namespace="gpupilot", service="gpupilot-adapter"),
            event="ADDED",
        )
    code, text = run(["check-apiservices", "--kubeconfig", str(cfg)], capsys)
    assert code == 0 and text.count(" ours") == 2


@pytest.mark.slow
def test_check_reads_kubeconfig_and_home_as_kubectl_does(kube_and_kubeconfig, capsys, monkeypatch, tmp_path):
    """Without --kubeconfig, $KUBECONFIG and then ~/.kube/config are read (as kubectl and apply do),
    not only the in-cluster account."""
    k, cfg = kube_and_kubeconfig
    k.store.put("apiregistration.k8s.io/apiservices", PROM_ADAPTER, event="ADDED")
    monkeypatch.setenv("KUBECONFIG", str(cfg))
    code, text = run(["check-apiservices"], capsys)
    assert code == 1 and "monitoring/prometheus-adapter" in text
    home = tmp_path / "home"
    (home / ".kube").mkdir(parents=True)
    (home / ".kube" / "config").write_text(cfg.read_text())
    monkeypatch.delenv("KUBECONFIG")
    monkeypatch.setenv("HOME", str(home))
    code, text = run(["check-apiservices"], capsys)
    assert code == 1 and "monitoring/prometheus-adapter" in text
    monkeypatch.setenv("HOME", str(tmp_path / "nowhere"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    code, text = run(["check-apiservices"], capsys)
    assert code == 2 and "$KUBECONFIG, ~/.kube/config, in-cluster service account" in text


@pytest.mark.slow
def test_check_with_an_unreachable_api_is_exit_2_one_line(tmp_path: Path, capsys):
    import socket  # noqa: PLC0415

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = tmp_path / "kubeconfig"
    cfg.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: c, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n"
        "users: [{name: c, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: c, user: c}}]\n"
    )
    code, text = run(["check-apiservices", "--kubeconfig", str(cfg)], capsys)
    assert code == 2 and text.startswith("check-apiservices: cannot tell: reading APIService")
    assert text.count("\n") == 1 and text.rstrip().endswith("failed: connection refused")


def test_owner_flag_is_validated(capsys):
    with pytest.raises(SystemExit):
        main(["check-apiservices", "--apiservice-owner", "no-slash"])
    assert "expected NAMESPACE/SERVICE" in capsys.readouterr().err


@pytest.mark.slow
def test_serve_warns_at_start_and_never_fails(kube_and_kubeconfig, caplog):
    k, _ = kube_and_kubeconfig
    k.store.put("apiregistration.k8s.io/apiservices", PROM_ADAPTER, event="ADDED")

    class Reader:
        def apiservices(self, names):
            return {n: k.store.get("apiregistration.k8s.io/apiservices", "", n) for n in names}

    class Broken:
        def apiservices(self, names):
            raise RuntimeError("connection refused")

    with caplog.at_level(logging.INFO, logger="adapter"):
        (warning,) = apiservice_check.warn_at_start(
            Reader(), owner=("gpupilot", "gpupilot-adapter"), external=False
        )
        assert (
            apiservice_check.warn_at_start(Broken(), owner=("gpupilot", "gpupilot-adapter"), external=True)
            == []
        )
    assert warning.startswith("custom.metrics.k8s.io is served by monitoring/prometheus-adapter")
    assert any(
        r.levelno == logging.WARNING and "do not reach this adapter" in r.message for r in caplog.records
    )
    assert any("not checked: connection refused" in r.message for r in caplog.records)
