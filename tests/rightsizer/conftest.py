"""Fixtures shared by the rightsizer's tests in several packages."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from devkit.prometheus import PrometheusServer
from tests.support.rightsizer.history import History
from tests.support.rightsizer.small_history import shared_blocks


@pytest.fixture(scope="module")
def small_history(tmp_path_factory: pytest.TempPathFactory) -> Iterator[History]:
    """A real Prometheus over the small history (tests/support/rightsizer/small_history.py), one per
    module: the blocks are built once per run and hard-linked into each module's data folder."""
    base = tmp_path_factory.mktemp("small-history")
    start, end = shared_blocks(tmp_path_factory, base / "data")
    with PrometheusServer(base / "data", log_file=base / "prometheus.log") as server:
        yield History(server.url, start, end)
