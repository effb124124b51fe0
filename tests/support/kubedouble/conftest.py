"""Fixtures shared by the API double's own tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.kubedouble import KubeDouble


@pytest.fixture
def kube() -> Iterator[KubeDouble]:
    """An empty API double, serving on a free loopback port for one test."""
    with KubeDouble() as k:
        yield k
