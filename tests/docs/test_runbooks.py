"""Every runbook's kubectl commands name objects the chart renders: the namespace is the release's
(or the GPU Operator's, for its own objects), each named object of a kind the chart renders exists
in a rendering of the chart, and each label selector matches a rendered workload's pods. The old
GPUExporterDown runbook sent people to gpu-operator, where the exporter never runs."""

from __future__ import annotations

import re
import shlex
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.test_helm import CHART, run_helm

ROOT = Path(__file__).resolve().parents[2]
RUNBOOKS = sorted((ROOT / "docs" / "runbooks").glob("*.md"))
RELEASE_NS = "gpupilot"
OPERATOR_NS = "gpu-operator"
# Every optional object the runbooks may name: auto-apply, external metrics, the scaler, cert-manager.
SETTINGS = (
    "rightsizer.autoApply.enabled=true",
    "adapter.externalMetrics=true",
    "adapter.externalScaler.enabled=true",
)
KINDS = {
    "deploy": "Deployment", "deployment": "Deployment", "deployments": "Deployment",
    "daemonset": "DaemonSet", "ds": "DaemonSet", "daemonsets": "DaemonSet",
    "service": "Service", "svc": "Service",
    "configmap": "ConfigMap", "cm": "ConfigMap", "configmaps": "ConfigMap",
    "secret": "Secret", "secrets": "Secret",
    "certificate": "Certificate",
    "servicemonitor": "ServiceMonitor",
    "networkpolicy": "NetworkPolicy",
    "apiservice": "APIService",
    "lease": "Lease",
    "pvc": "PersistentVolumeClaim",
}  # fmt: skip
RUNTIME = {
    ("Lease", RELEASE_NS, "gpupilot-rightsizer-leader"),
    ("ConfigMap", RELEASE_NS, "gpupilot-rightsizer-ledger"),
    ("Lease", OPERATOR_NS, "gpupilot-rightsizer-apply"),
    ("ConfigMap", OPERATOR_NS, "default-mig-parted-config"),
}
"""Objects the services make at run time (or the GPU Operator's), which no rendering holds."""
VERBS = {
    "get",
    "describe",
    "logs",
    "exec",
    "annotate",
    "port-forward",
    "top",
    "delete",
    "rollout",
    "label",
    "edit",
}
WITH_VALUE = {"-n", "--namespace", "-l", "--selector", "-o", "--output", "--tail", "-c", "--container", "-L",
              "--field-selector", "-p", "--type"}  # fmt: skip


@cache
def rendered() -> tuple[dict[str, Any], ...]:
    args = ["template", "gpupilot", str(CHART), "--namespace", RELEASE_NS]
    for s in SETTINGS:
        args += ["--set", s]
    res = run_helm(*args)
    assert res.returncode == 0, res.stderr
    cert_manager = run_helm(*args, "--set", "adapter.certManager.enabled=true")
    assert cert_manager.returncode == 0, cert_manager.stderr
    docs = [*yaml.safe_load_all(res.stdout), *yaml.safe_load_all(cert_manager.stdout)]
    return tuple(d for d in docs if d)


def objects() -> set[tuple[str, str, str]]:
    return {(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]) for o in rendered()}


def pod_labels() -> list[tuple[str, dict[str, str]]]:
    """(namespace, labels) of every rendered workload's pods."""
    out = []
    for o in rendered():
        if o["kind"] in ("Deployment", "DaemonSet"):
            out.append((o["metadata"]["namespace"], o["spec"]["template"]["metadata"]["labels"]))
    return out


def commands(page: Path) -> list[str]:
    """Every kubectl command line of a page: in code blocks, and in `inline code` spans."""
    text = page.read_text()
    found = []
    for block in re.findall(r"```(?:sh|bash)?\n(.*?)```", text, re.S):
        joined = block.replace("\\\n", " ")
        found += [
            line.split(" #")[0].strip() for line in joined.splitlines() if line.strip().startswith("kubectl ")
        ]
    for span in re.findall(r"`([^`]+)`", re.sub(r"```.*?```", "", text, flags=re.S).replace("\n", " ")):
        if span.startswith("kubectl "):
            found.append(span)
    return found


def references(command: str) -> tuple[str, list[tuple[str, str]], list[str]]:
    """(namespace or "", [(kind, name)], [label selectors]) a kubectl command names."""
    words = shlex.split(command.split("&&", maxsplit=1)[0].split("|", maxsplit=1)[0])[1:]
    namespace, selectors, plain = "", [], []
    i = 0
    while i < len(words):
        w = words[i]
        if w in WITH_VALUE and i + 1 < len(words):
            if w in ("-n", "--namespace"):
                namespace = words[i + 1]
            if w in ("-l", "--selector"):
                selectors.append(words[i + 1])
            i += 2
            continue
        if w.startswith("--namespace="):
            namespace = w.split("=", 1)[1]
        elif not w.startswith("-"):
            plain.append(w)
        i += 1
    named: list[tuple[str, str]] = []
    if plain and plain[0] == "rollout":
        plain = plain[1:]
    if not plain or plain[0] not in VERBS:
        return namespace, named, selectors
    rest = plain[1:]
    j = 0
    while j < len(rest):
        word = rest[j]
        if "/" in word and word.split("/", 1)[0] in KINDS:
            kind, name = word.split("/", 1)
            named.append((KINDS[kind], name))
        elif (
            word in KINDS and j + 1 < len(rest) and not rest[j + 1].startswith("-") and "=" not in rest[j + 1]
        ):
            named.append((KINDS[word], rest[j + 1]))
            j += 1
        elif word == "--":
            break
        j += 1
    return namespace, named, selectors


def test_every_runbook_has_a_command() -> None:
    lacking = [p.name for p in RUNBOOKS if not commands(p) and "kubectl" not in p.read_text()]
    assert len(lacking) < len(RUNBOOKS) // 2, lacking


@pytest.mark.slow
@pytest.mark.parametrize("page", RUNBOOKS, ids=[p.stem for p in RUNBOOKS])
def test_runbook_commands_name_what_the_chart_renders(page: Path) -> None:
    known = objects() | RUNTIME
    kinds = {k for k, _ns, _n in known}
    for command in commands(page):
        namespace, named, selectors = references(command)
        assert namespace in ("", RELEASE_NS, OPERATOR_NS), f"{page.name}: {command}: namespace {namespace}"
        for kind, name in named:
            if kind not in kinds:
                continue  # nodes, events, the operator's own kinds: not the chart's to check
            where = namespace or ("" if kind == "APIService" else RELEASE_NS)
            assert (kind, where, name) in known, f"{page.name}: {command}: no {kind} {where}/{name} rendered"
        for selector in selectors:
            wanted = dict(
                pair.split("=", 1) for pair in selector.split(",") if "=" in pair and "!" not in pair
            )
            if not any(k.startswith("app.kubernetes.io/") for k in wanted):
                continue  # the operator's own pods (app=nvidia-mig-manager)
            ns = namespace or RELEASE_NS
            assert any(
                pns == ns and all(labels.get(k) == v for k, v in wanted.items())
                for pns, labels in pod_labels()
            ), f"{page.name}: {command}: no pod of the chart in {ns} matches {selector}"


def test_the_check_catches_a_wrong_namespace() -> None:
    """The old GPUExporterDown command: its namespace is the operator's, and no chart pod runs there."""
    namespace, _named, selectors = references(
        "kubectl -n gpu-operator get pods -l app.kubernetes.io/name=gpupilot-exporter -o wide"
    )
    assert namespace == OPERATOR_NS and selectors == ["app.kubernetes.io/name=gpupilot-exporter"]
    assert not any(
        pns == OPERATOR_NS and labels.get("app.kubernetes.io/name") == "gpupilot-exporter"
        for pns, labels in pod_labels()
    )
    assert references("kubectl -n gpupilot logs deploy/gpupilot-adapter --tail=50")[1] == [
        ("Deployment", "gpupilot-adapter")
    ]
