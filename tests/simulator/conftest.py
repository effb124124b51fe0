"""Fixtures shared by the simulator's tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator import scenario
from simulator.model import Scenario

DEMO = Path(__file__).resolve().parents[2] / "examples" / "fleet-demo.yaml"


@pytest.fixture(scope="module")
def demo() -> Scenario:
    """examples/fleet-demo.yaml, loaded once per module (tests read it, none changes it)."""
    return scenario.load(DEMO)
