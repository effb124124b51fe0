"""The real control plane for the tests of what Kubernetes decides (``make kube-test``): one
kube-apiserver, controller-manager, scheduler, etcd and KWOK per run (:mod:`devkit.cluster`), with
the simulated GPU nodes of ``examples/fleet-demo.yaml``, two nodes without GPUs and the MIG Manager
stand-in. Every test here is marked ``kube`` and runs on one pytest-xdist worker (``make test``
leaves them out: the control plane is built from Go modules, which ``make kube-test`` does first).

``namespace``: a fresh namespace per test. When a test fails, its namespace's objects are written to
``<cluster dir>/failed/<test>.yaml`` and the failure's report names that file and the components'
logs; the cluster's folder is then kept.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SCENARIO = REPO / "examples" / "fleet-demo.yaml"


@dataclass
class RealCluster:
    cp: Any
    """:class:`devkit.cluster.ControlPlane`."""
    kube: Any
    """:class:`devkit.cluster.kubeclient.Kube` as the cluster's admin."""
    manager: Any
    """:class:`devkit.cluster.migmanager.MigManager`."""
    failures: int = 0

    @property
    def kubeconfig(self) -> Path:
        return Path(self.cp.admin_kubeconfig)

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> Any:
        import subprocess  # noqa: PLC0415

        from devkit import gobuild  # noqa: PLC0415

        res = subprocess.run(
            [str(gobuild.binary("kube").with_name("kubectl")), f"--kubeconfig={self.kubeconfig}", *args],
            input=stdin,
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        if check and res.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {res.stderr.strip()[-500:]}")
        return res


@pytest.fixture(scope="session")
def real_cluster() -> Iterator[RealCluster]:
    from devkit.cluster import ControlPlane, Settings  # noqa: PLC0415
    from devkit.cluster.kubeclient import Kube  # noqa: PLC0415
    from devkit.cluster.migmanager import MigManager  # noqa: PLC0415
    from devkit.cluster.nodes import add_from_scenario  # noqa: PLC0415

    # not under pytest's basetemp: other runs on the machine prune it, and a failure's objects and
    # logs must stay where its report says
    where = Path(tempfile.mkdtemp(prefix="gpupilot-control-plane-"))
    # GPUPILOT_KUBE_TOOL=kube-1.34: the same tests on the oldest release covered
    cp = ControlPlane(where, Settings(kube_tool=os.environ.get("GPUPILOT_KUBE_TOOL", "kube"))).start()
    manager = None
    try:
        add_from_scenario(cp.admin_kubeconfig, SCENARIO)
        manager = MigManager(cp.admin_kubeconfig).start()
        cluster = RealCluster(cp, Kube(cp.admin_kubeconfig), manager)
        yield cluster
    finally:
        if manager is not None:
            manager.stop()
        cp.stop()
    if not cluster.failures:
        shutil.rmtree(where, ignore_errors=True)


@pytest.fixture(scope="session")
def chart(real_cluster: RealCluster) -> str:
    """The chart installed once per run (tests/kube/world.py: install_chart); its namespace."""
    from tests.kube import world  # noqa: PLC0415

    world.install_chart(real_cluster)
    return world.RELEASE_NS


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    report = yield
    setattr(item, f"rep_{report.when}", report)  # type: ignore[attr-defined]
    return report


@pytest.fixture
def namespace(real_cluster: RealCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace of the test's own, removed after it (kept, and dumped, when the test failed)."""
    full = request.node.name.lower()
    # the test's name, cut to fit a namespace, and a digest of the whole (parameters differ at its end)
    digest = hashlib.sha1(full.encode()).hexdigest()[:6]
    name = f"{re.sub(r'[^a-z0-9-]', '-', full)[:50].strip('-')}-{digest}"
    real_cluster.kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    yield name
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        real_cluster.failures += 1
        dump = Path(real_cluster.cp.directory) / "failed" / f"{name}.yaml"
        dump.parent.mkdir(parents=True, exist_ok=True)
        res = real_cluster.kubectl(
            "get",
            "all,events,pdb,configmaps,leases,roles,rolebindings",
            "-n",
            name,
            "-o",
            "yaml",
            check=False,
        )
        nodes = real_cluster.kubectl("get", "nodes", "-o", "yaml", check=False)
        dump.write_text(res.stdout + "\n---\n" + nodes.stdout)
        report.sections.append(
            (
                "real control plane",
                f"objects of namespace {name} and the nodes: {dump}\ncomponents' logs: {real_cluster.cp.logs}\naudit log: {real_cluster.cp.audit_log}",
            )
        )
        return
    real_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def dump_yaml(objs: list[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(objs, sort_keys=False)
