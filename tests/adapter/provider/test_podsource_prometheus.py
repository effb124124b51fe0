"""The Prometheus pod source (explain-hpa's default): pods and their labels from kube-state-metrics,
and one warning per namespace when kube_pod_labels carries no labels (not allow-listed)."""

from __future__ import annotations

import logging

import pytest

from adapter.provider.podsource import PrometheusPodSource
from gpupilot_common.promanswer import Sample


class Answers:
    """A Prometheus client answering the two queries the pod source asks, from fixed samples."""

    def __init__(self, labels: list[dict[str, str]]) -> None:
        self.labels = labels

    def query(self, promql: str, *, at: float | None = None, purpose: str = "value") -> list[Sample]:
        if promql.startswith("kube_pod_labels"):
            return [Sample(row, 1.0, 0.0) for row in self.labels]
        return [Sample({"pod": row["pod"], "phase": "Running"}, 1.0, 0.0) for row in self.labels]


def test_labels_become_pod_labels() -> None:
    source = PrometheusPodSource(Answers([{"namespace": "ml", "pod": "a", "label_app": "llm"}]))  # type: ignore[arg-type]
    fetched = source._fetch("ml")
    (pod,) = fetched.pods
    assert pod.labels == {"app": "llm"} and pod.ready


def test_pods_without_any_label_are_said_once(caplog: pytest.LogCaptureFixture) -> None:
    source = PrometheusPodSource(Answers([{"namespace": "ml", "pod": "a"}, {"namespace": "ml", "pod": "b"}]))  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING):
        source._fetch("ml")
        source._fetch("ml")
    (record,) = caplog.records
    assert "kube_pod_labels of namespace ml carries no pod labels" in record.getMessage()
    assert (
        "--metric-labels-allowlist" in record.getMessage()
        and "--pod-source kubernetes" in record.getMessage()
    )
