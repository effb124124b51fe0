"""Fixtures shared by the exporter's tests."""

from __future__ import annotations

import pytest

from tests.support.exporter import pki as pki_mod


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> pki_mod.Pki:
    """A CA, server and client certificates minted for one test module."""
    return pki_mod.mint(tmp_path_factory.mktemp("pki"))
