"""gpupilot-rightsizer drain against the API double: the drain request written on the stop-signal
ConfigMap, then the apply Lease watched: free at once, freed while waiting, still held at the
timeout (exit 1, naming the holder), and nothing to drain without a ConfigMap."""

from __future__ import annotations

import datetime as dt
import threading
import time
from pathlib import Path

import pytest

from rightsizer.apply.lease import LEASE_NAME
from rightsizer.cli import main
from rightsizer.serve.stopsignal import ANN_DRAIN, parse_time
from tests.support.kubedouble import KubeDouble

pytestmark = pytest.mark.slow
LEASES = "coordination.k8s.io/leases"


def lease(holder: str | None, *, renewed: dt.datetime) -> dict[str, object]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": LEASE_NAME, "namespace": "gpu-operator"},
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": 60,
            "renewTime": renewed.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        },
    }


def drain(config: Path, *extra: str) -> list[str]:
    return [
        "drain", "--namespace", "gpupilot", "--configmap", "gpupilot-rightsizer",
        "--lease-namespace", "gpu-operator", "--kubeconfig", str(config), *extra,
    ]  # fmt: skip


def test_nothing_to_drain_without_the_configmap(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with KubeDouble(run_mig_manager=False) as kube:
        assert main(drain(kube.write_kubeconfig(tmp_path / "kc"))) == 0
    assert "nothing to drain: no ConfigMap gpupilot/gpupilot-rightsizer" in capsys.readouterr().out


def test_the_request_is_written_and_a_free_lease_ends_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with KubeDouble(run_mig_manager=False) as kube:
        kube.add_configmap("gpupilot-rightsizer", namespace="gpupilot", data={"rightsizer.yaml": "x"})
        kube.store.put(LEASES, lease(None, renewed=dt.datetime.now(dt.UTC)), event="ADDED")
        before = time.time()
        assert main(drain(kube.write_kubeconfig(tmp_path / "kc"))) == 0
        found = kube.configmap("gpupilot-rightsizer", namespace="gpupilot")
        assert found is not None
        asked = found["metadata"]["annotations"][ANN_DRAIN]
    when = parse_time(asked)
    assert when is not None and before - 2 <= when <= time.time() + 1
    assert "no auto-apply in flight" in capsys.readouterr().out


def test_it_waits_for_the_holder_to_give_the_lease_back(tmp_path: Path) -> None:
    with KubeDouble(run_mig_manager=False) as kube:
        kube.add_configmap("gpupilot-rightsizer", namespace="gpupilot", data={})
        kube.store.put(LEASES, lease("serve-0", renewed=dt.datetime.now(dt.UTC)), event="ADDED")

        def give_back() -> None:
            time.sleep(3)
            kube.store.put(LEASES, lease(None, renewed=dt.datetime.now(dt.UTC)), event="MODIFIED")

        threading.Thread(target=give_back, daemon=True).start()
        started = time.monotonic()
        assert main(drain(kube.write_kubeconfig(tmp_path / "kc"), "--timeout", "60s")) == 0
        assert 2.5 <= time.monotonic() - started < 30


def test_a_holder_still_there_at_the_timeout_fails_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with KubeDouble(run_mig_manager=False) as kube:
        kube.add_configmap("gpupilot-rightsizer", namespace="gpupilot", data={})
        stop = threading.Event()

        def renew() -> None:
            while not stop.is_set():
                kube.store.put(LEASES, lease("serve-0", renewed=dt.datetime.now(dt.UTC)), event="MODIFIED")
                stop.wait(1.0)

        threading.Thread(target=renew, daemon=True).start()
        try:
            assert main(drain(kube.write_kubeconfig(tmp_path / "kc"), "--timeout", "3s")) == 1
        finally:
            stop.set()
    err = capsys.readouterr().err
    assert err.startswith("error: serve-0 still holds the apply Lease gpu-operator/gpupilot-rightsizer-apply")
    assert err.count("\n") == 1
