"""``python -m devkit.scan --checkov PATH``: checkov over every rendering of the chart and the overlays.

Each rendering (the chart's defaults, auto-apply, cert-manager, the exporter's privileged features,
OpenShift, and the kustomize overlays) is written to a file and scanned with ``checkov --framework
kubernetes``. Every failed check must be accepted in ``deploy/scan-allowlist.yaml`` (check id, kind,
name and why); any other is printed as one line and the run fails. The figures per component
(failed checks, accepted ones) are printed at the end. checkov runs from its own venv (``make scan``
makes ``.venv-scan``), apart from the services' dependencies.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "deploy" / "helm" / "gpupilot"
ALLOWLIST = ROOT / "deploy" / "scan-allowlist.yaml"
COMPONENTS = ("exporter", "adapter", "rightsizer")

RENDERINGS: dict[str, list[str]] = {
    "chart defaults": [],
    "chart auto-apply": ["--set", "rightsizer.autoApply.enabled=true"],
    "chart cert-manager": ["--set", "adapter.certManager.enabled=true"],
    "chart exporter features": [
        "--set",
        "exporter.processes.enabled=true",
        "--set",
        "exporter.migMonitor.enabled=true",
    ],
    "chart openshift": ["-f", str(CHART / "ci" / "openshift.yaml")],
    "kustomize gpu-operator": [],
    "kustomize openshift": [],
}
"""Name → extra arguments of `helm template` (chart) or nothing (kustomize: the overlay's folder)."""


class ScanError(RuntimeError):
    """A rendering or checkov itself failed (not a finding)."""


@dataclass(frozen=True)
class Finding:
    rendering: str
    check: str
    kind: str
    name: str
    title: str

    @property
    def component(self) -> str:
        for c in COMPONENTS:
            if self.name.startswith(f"gpupilot-{c}"):
                return c
        return "other"


def render(name: str, *, helm: str, kubectl: str) -> str:
    if name.startswith("kustomize "):
        overlay = ROOT / "deploy" / "overlays" / name.split(" ", 1)[1]
        cmd = [kubectl, "kustomize", str(overlay)]
    else:
        cmd = [helm, "template", "gpupilot", str(CHART), "--namespace", "gpupilot", *RENDERINGS[name]]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        last = (res.stderr.strip().splitlines() or ["no output"])[-1]
        raise ScanError(f"{name}: {' '.join(cmd[:3])} failed: {last}")
    return res.stdout


def scan(name: str, text: str, *, checkov: str, tmp: Path) -> list[Finding]:
    path = tmp / (name.replace(" ", "-") + ".yaml")
    path.write_text(text)
    cmd = [checkov, "--framework", "kubernetes", "-f", str(path), "-o", "json", "--quiet", "--compact"]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    try:
        doc = json.loads(res.stdout or "{}")
    except json.JSONDecodeError:
        last = (res.stderr.strip().splitlines() or ["no output"])[-1]
        raise ScanError(f"{name}: checkov gave no JSON: {last}") from None
    reports = doc if isinstance(doc, list) else [doc]
    out = []
    for report in reports:
        for failed in (report.get("results") or {}).get("failed_checks") or []:
            kind, _, rest = str(failed.get("resource", "")).partition(".")
            out.append(
                Finding(
                    name,
                    str(failed["check_id"]),
                    kind,
                    rest.rsplit(".", 1)[-1],
                    str(failed.get("check_name", "")),
                )
            )
    return out


def load_allowlist(path: Path = ALLOWLIST) -> dict[tuple[str, str, str], str]:
    """(check, kind, name) → why; one line naming the entry when one is incomplete."""
    doc = yaml.safe_load(path.read_text()) or {}
    out: dict[tuple[str, str, str], str] = {}
    for i, entry in enumerate(doc.get("accepted") or []):
        missing = [k for k in ("check", "kind", "name", "why") if not str(entry.get(k, "")).strip()]
        if missing:
            raise ScanError(f"{path.name}: accepted[{i}] lacks {', '.join(missing)}")
        out[(str(entry["check"]), str(entry["kind"]), str(entry["name"]))] = str(entry["why"])
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devkit.scan", description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkov", default=str(ROOT / ".venv-scan" / "bin" / "checkov"))
    parser.add_argument("--helm", default=str(ROOT / ".venv" / "bin" / "helm"))
    parser.add_argument("--kubectl", default="kubectl")
    parser.add_argument("--allowlist", type=Path, default=ALLOWLIST)
    args = parser.parse_args(argv)
    try:
        allowed = load_allowlist(args.allowlist)
        findings: list[Finding] = []
        with tempfile.TemporaryDirectory(prefix="gpupilot-scan-") as tmp:
            for name in RENDERINGS:
                text = render(name, helm=args.helm, kubectl=args.kubectl)
                findings += scan(name, text, checkov=args.checkov, tmp=Path(tmp))
    except ScanError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    new = sorted(
        {f for f in findings if (f.check, f.kind, f.name) not in allowed},
        key=lambda f: (f.rendering, f.check, f.name),
    )
    used = {(f.check, f.kind, f.name) for f in findings}
    for key in sorted(set(allowed) - used):
        print(f"note: {args.allowlist.name}: {' '.join(key)} matched no finding (remove it?)")
    print(
        f"{'rendering':<26} "
        + " ".join(f"{c:>11}" for c in (*COMPONENTS, "other"))
        + "   (failed checks, accepted in brackets)"
    )
    for name in RENDERINGS:
        here = [f for f in findings if f.rendering == name]
        total = Counter(f.component for f in here)
        ok = Counter(f.component for f in here if (f.check, f.kind, f.name) in allowed)
        cells = [f"{total[c]:>5} ({ok[c]:>3})" for c in (*COMPONENTS, "other")]
        print(f"{name:<26} " + " ".join(cells))
    for f in new:
        print(f"new finding: {f.rendering}: {f.check} {f.kind}/{f.name}: {f.title}")
    return 1 if new else 0


if __name__ == "__main__":
    raise SystemExit(main())
