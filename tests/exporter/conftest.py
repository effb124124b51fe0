"""Fixtures shared by the exporter's tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter.collect.collector import Collector
from exporter.settings import CollectorSettings
from tests.support.exporter import fakes
from tests.support.exporter import pki as pki_mod
from tests.support.exporter.kubelet_double import KubeletDouble


@pytest.fixture(scope="module")
def exporter_pki(tmp_path_factory: pytest.TempPathFactory) -> pki_mod.Pki:
    """One CA issuing the exporter's server certificate and a client certificate, and a stranger's
    certificate from another CA, minted once per test module. (The adapter's tests have their own:
    four CAs for the aggregation layer.)"""
    return pki_mod.mint(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def one_gpu_collector() -> Collector:
    """A collector over a fake node with one whole GPU, collected once."""
    backend = fakes.FakeBackend(fakes.node(fakes.whole_gpu(0)))
    c = Collector(backend, hostname="n", settings=CollectorSettings(interval=10, collect_timeout=1))
    c.collect_once()
    return c


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[KubeletDouble]:
    """A real gRPC kubelet PodResources double on a Unix socket in the test's folder."""
    # Unix socket paths are limited to ~107 bytes; pytest's tmp_path can be long.
    path = tmp_path / "k.sock"
    if len(str(path)) > 100:
        pytest.fail(f"tmp_path too long for a unix socket: {path}")
    with KubeletDouble(path) as double:
        yield double
