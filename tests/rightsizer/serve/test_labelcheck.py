"""serve's kube-state-metrics check: one line per missing series or allow-listed label, none when
everything serve's alerts and reports read is there."""

from __future__ import annotations

from rightsizer.serve.labelcheck import gaps

ALL = {
    'count(gpupilot_gpu_info{mig_mode="enabled"})': 8.0,
    "count(kube_node_labels)": 4.0,
    'count(kube_node_labels{label_nvidia_com_mig_config!=""})': 2.0,
    "count(kube_pod_labels)": 40.0,
    'count(kube_pod_labels{label_app_kubernetes_io_name!=""}) or count(kube_pod_labels{label_app!=""})': 12.0,
}


def check(table: dict[str, float]) -> list[str]:
    return gaps(lambda expr: table[expr])


def test_nothing_missing() -> None:
    assert check(ALL) == []


def test_node_labels_not_allow_listed() -> None:
    table = dict(ALL)
    table['count(kube_node_labels{label_nvidia_com_mig_config!=""})'] = 0.0
    (line,) = check(table)
    assert "no nvidia.com/mig.config label" in line and "MIGReconfigurationFailed" in line
    assert "--metric-labels-allowlist=nodes=[nvidia.com/mig.config,nvidia.com/mig.config.state" in line


def test_kube_state_metrics_not_scraped() -> None:
    table = dict(ALL)
    table["count(kube_node_labels)"] = 0.0
    (line,) = check(table)
    assert line.startswith("no kube_node_labels in Prometheus")


def test_no_mig_no_node_line() -> None:
    table = dict(ALL)
    table['count(gpupilot_gpu_info{mig_mode="enabled"})'] = 0.0
    table["count(kube_node_labels)"] = 0.0
    assert check(table) == []


def test_pod_labels_not_allow_listed() -> None:
    table = dict(ALL)
    table[
        'count(kube_pod_labels{label_app_kubernetes_io_name!=""}) or count(kube_pod_labels{label_app!=""})'
    ] = 0.0
    (line,) = check(table)
    assert "kube_pod_labels carries no app.kubernetes.io/name" in line and "pods=[" in line
