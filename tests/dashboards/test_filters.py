"""dashboards.filters: every metric selector of every panel gets the $cluster matcher, exporter series
also $job; functions, aggregations, label lists, strings, durations and variables are left alone."""

from __future__ import annotations

import pytest

from dashboards import build
from dashboards.filters import add_filters, variable_query
from tests.dashboards import panels

C, J = 'cluster=~"$cluster"', 'job=~"$job"'


@pytest.mark.parametrize(
    ("expr", "want"),
    [
        (
            "max by (Hostname, UUID) (DCGM_FI_DEV_POWER_USAGE)",
            f"max by (Hostname, UUID) (DCGM_FI_DEV_POWER_USAGE{{{C}, {J}}})",
        ),
        (
            'avg(gpupilot:slice_activity:avg5m{pod!=""})',
            f'avg(gpupilot:slice_activity:avg5m{{{C}, pod!=""}})',
        ),
        (
            "count(gpupilot_gpu_lost == 1) or vector(0)",
            f"count(gpupilot_gpu_lost{{{C}, {J}}} == 1) or vector(0)",
        ),
        (
            'sum(rate(gpupilot_xid_errors_total{Hostname=~"$Hostname"}[$__rate_interval])) by (xid)',
            f'sum(rate(gpupilot_xid_errors_total{{{C}, {J}, Hostname=~"$Hostname"}}[$__rate_interval])) by (xid)',
        ),
        (
            "a and on (namespace, pod) kube_pod_status_phase offset 1h",
            f"a{{{C}}} and on (namespace, pod) kube_pod_status_phase{{{C}}} offset 1h",
        ),
        (
            'label_replace(up, "x", "$1", "job", "(.*)")',
            f'label_replace(up{{{C}}}, "x", "$1", "job", "(.*)")',
        ),
        ("gpupilot_adapter_values_age_seconds > 300", f"gpupilot_adapter_values_age_seconds{{{C}}} > 300"),
        (
            "sum without (pod) (x) / on (a) group_left (b) y",
            f"sum without (pod) (x{{{C}}}) / on (a) group_left (b) y{{{C}}}",
        ),
    ],
)
def test_selectors_get_the_matchers(expr: str, want: str) -> None:
    assert add_filters(expr) == want


def test_variable_queries() -> None:
    assert variable_query("label_values(gpupilot_gpu_info, Hostname)") == (
        f"label_values(gpupilot_gpu_info{{{C}, {J}}}, Hostname)"
    )


@pytest.mark.parametrize("name", sorted(build.DASHBOARDS))
def test_every_dashboard_has_the_cluster_and_job_variables_and_uses_them(name: str) -> None:
    dashboard = panels.load(panels.REPO / "dashboards" / name)
    names = [v["name"] for v in panels.variables(dashboard)]
    assert names[:2] == ["cluster", "job"]
    for p in panels.panels(dashboard):
        for t in p.get("targets", []):
            assert "$cluster" in t["expr"], f"{name}: {p['title']}: {t['expr']}"
