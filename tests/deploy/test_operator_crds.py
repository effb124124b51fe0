"""The chart's and the kustomize overlays' ServiceMonitor, PodMonitor and PrometheusRule objects
against the prometheus-operator's own CRD schemas (generated from its API types at the pinned
release by devkit.gobuild's ``prometheus-operator-crds``), as ``kubectl apply --validate=strict``
would judge them: types, enums, patterns, required and unknown fields (the three CRDs carry no CEL
rules, which only an API server could evaluate)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from devkit import gobuild, operator_crds
from tests.deploy.test_helm import template
from tests.deploy.test_manifests import all_objects

pytestmark = [pytest.mark.compat, pytest.mark.slow]

KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
VARIANTS = ("defaults", "everything", "openshift", "victoriametrics", "mimir", "exporter-only")


@pytest.fixture(scope="module")
def crds() -> Path:
    return operator_crds.crd_dir()


def _monitoring(objs: Any) -> list[dict[str, Any]]:
    return [o for o in objs if o.get("kind") in KINDS]


def test_the_crds_are_the_pinned_operators(crds: Path) -> None:
    names = {p.name for p in crds.glob("*.yaml")}
    assert {
        f"monitoring.coreos.com_{k}.yaml" for k in ("servicemonitors", "podmonitors", "prometheusrules")
    } <= names
    served = operator_crds.schemas(crds)
    assert {("ServiceMonitor", "v1"), ("PodMonitor", "v1"), ("PrometheusRule", "v1")} <= set(served)
    assert gobuild.PROMETHEUS_OPERATOR_RELEASE in str(crds)


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_charts_monitoring_objects_validate(crds: Path, variant: str) -> None:
    objs = _monitoring(template(variant))
    if variant == "everything":
        assert {o["kind"] for o in objs} == KINDS, "the everything variant renders all three kinds"
    problems = [p for o in objs for p in operator_crds.validate(o, crds)]
    assert not problems, "\n".join(problems)


def test_the_kustomize_monitoring_objects_validate(crds: Path) -> None:
    objs = [(where, o) for where, o in all_objects() if o.get("kind") in KINDS]
    assert {o["kind"] for _, o in objs} >= {"ServiceMonitor", "PrometheusRule"}
    problems = [f"deploy/{where}: {p}" for where, o in objs for p in operator_crds.validate(o, crds)]
    assert not problems, "\n".join(problems)


def test_a_wrong_object_is_named_with_its_field(crds: Path) -> None:
    """The validation is not vacuous: each kind of mistake is reported with the field's path."""
    monitor = copy.deepcopy(next(o for o in template("everything") if o["kind"] == "ServiceMonitor"))
    monitor["spec"]["endpoints"][0]["interval"] = "every 30 seconds"  # pattern
    monitor["spec"]["endpoints"][0]["honorLabel"] = True  # unknown (honorLabels)
    monitor["spec"]["endpoints"][0]["scheme"] = "ftp"  # enum
    monitor["spec"].pop("selector")  # required
    problems = operator_crds.validate(monitor, crds)
    text = "\n".join(problems)
    assert ".spec.endpoints[0].interval" in text and "does not match" in text
    assert ".spec.endpoints[0].honorLabel: unknown field" in text
    assert ".spec.endpoints[0].scheme" in text
    assert "required field 'selector' missing" in text
    rule = copy.deepcopy(next(o for o in template("everything") if o["kind"] == "PrometheusRule"))
    rule["spec"]["groups"][0]["rules"][0]["for"] = 300  # an integer where a duration string goes
    assert any(".spec.groups[0].rules[0].for" in p for p in operator_crds.validate(rule, crds))


def test_the_offline_check_covers_the_whole_schema(crds: Path) -> None:
    """CEL rules (``x-kubernetes-validations``) need an API server; the three CRDs hold none at this
    release, so the checks above are all their schemas ask. A release that adds some fails here."""
    for plural in ("servicemonitors", "podmonitors", "prometheusrules"):
        assert "x-kubernetes-validations" not in (crds / f"monitoring.coreos.com_{plural}.yaml").read_text()
    objs = _monitoring(template("everything"))
    assert {o["kind"] for o in objs} == KINDS
    assert [operator_crds.cel_rules(o, crds) for o in objs] == [0] * len(objs)
