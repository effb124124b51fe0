"""devkit.scan: every rendering is scanned; a finding the allow-list does not accept fails the run with
one line, an accepted one is counted. checkov is a script here that answers as checkov's JSON does;
the renderings are the real helm and kubectl output."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from devkit import scan

HELM = str(Path(sys.executable).parent / "helm")


def fake_checkov(tmp_path: Path, failed: list[dict[str, str]]) -> str:
    path = tmp_path / "checkov"
    doc = {"check_type": "kubernetes", "results": {"failed_checks": failed}}
    path.write_text(f"#!/bin/sh\ncat <<'EOF'\n{json.dumps(doc)}\nEOF\n")
    path.chmod(0o755)
    return str(path)


FINDING = {
    "check_id": "CKV_K8S_17",
    "check_name": "Containers should not share the host process ID namespace",
    "resource": "DaemonSet.gpupilot.gpupilot-exporter",
}


@pytest.mark.slow
def test_a_finding_not_accepted_fails_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    allow = tmp_path / "allow.yaml"
    allow.write_text("accepted: []\n")
    args = ["--checkov", fake_checkov(tmp_path, [FINDING]), "--helm", HELM, "--allowlist", str(allow)]
    assert scan.main(args) == 1
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("new finding")]
    assert lines[0] == (
        "new finding: chart auto-apply: CKV_K8S_17 DaemonSet/gpupilot-exporter: "
        "Containers should not share the host process ID namespace"
    )
    assert len(lines) == len(scan.RENDERINGS)
    allow.write_text(
        yaml.safe_dump(
            {
                "accepted": [
                    {"check": "CKV_K8S_17", "kind": "DaemonSet", "name": "gpupilot-exporter", "why": "x"}
                ]
            }
        )
    )
    assert scan.main(args) == 0
    table = capsys.readouterr().out
    assert "chart defaults                 1 (  1)" in table and "new finding" not in table


def test_the_allowlist_names_a_reason_for_every_entry(tmp_path: Path) -> None:
    accepted = scan.load_allowlist()
    assert accepted and all(len(why) > 10 for why in accepted.values())
    bad = tmp_path / "allow.yaml"
    bad.write_text("accepted:\n  - {check: CKV_K8S_1, kind: Pod, name: x}\n")
    with pytest.raises(scan.ScanError, match=r"^allow.yaml: accepted\[0\] lacks why$"):
        scan.load_allowlist(bad)
