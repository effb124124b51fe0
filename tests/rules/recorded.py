"""Waiting for the recording rules on a live Prometheus: rule groups evaluate independently, so a
level-2 rule (rules/recording-fleet.rules.yaml) has data one evaluation after its level-1 inputs."""

from __future__ import annotations

import time
from pathlib import Path

import requests
import yaml

REPO = Path(__file__).resolve().parents[2]


def record_names() -> list[str]:
    names = []
    for path in sorted((REPO / "rules").glob("*.rules.yaml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            names += [r["record"] for r in group["rules"] if "record" in r]
    return names


def wait_for_records(url: str, *, timeout: float = 90.0) -> None:
    """Return once every recording rule has a current series; fail naming the missing ones."""
    deadline = time.monotonic() + timeout
    missing = record_names()
    while True:
        missing = [
            name
            for name in missing
            if not requests.get(f"{url}/api/v1/query", params={"query": name}, timeout=30).json()["data"][
                "result"
            ]
        ]
        if not missing:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"recording rules without data after {timeout:.0f}s: {missing}")
        time.sleep(1)
