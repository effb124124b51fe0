"""convert-config: prometheus-adapter configs written from its documented format (the DCGM rules of
NVIDIA's HPA walkthrough, a rate rule with name.matches/as and resources.template, a queue-depth
external rule, a regex seriesQuery, resourceRules) become our format, the result loads and renders
the same PromQL, and every item left out is one line naming it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from adapter.cli import main
from adapter.config.convert import convert
from adapter.config.mapping import load_config
from adapter.provider.values import render_query

PROMETHEUS_ADAPTER = """
rules:
  # DCGM utilisation with the labels dcgm-exporter gets when scraped with honorLabels: false
  - seriesQuery: 'DCGM_FI_DEV_GPU_UTIL{exported_namespace!="",exported_pod!=""}'
    resources:
      overrides:
        exported_namespace: {resource: "namespace"}
        exported_pod: {resource: "pod"}
        Hostname: {resource: "node"}
    name:
      matches: "^DCGM_FI_DEV_GPU_UTIL$"
      as: "gpu_utilization"
    metricsQuery: avg(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)
  - seriesQuery: 'DCGM_FI_DEV_FB_USED{namespace!="",pod!=""}'
    resources:
      template: <<.Resource>>
    metricsQuery: sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)
  - seriesQuery: 'http_requests_total{namespace!="",pod!=""}'
    seriesFilters:
      - isNot: "^.*_bucket$"
    resources:
      overrides:
        namespace: {resource: namespace}
        pod: {resource: pod}
    name:
      matches: "^(.*)_total$"
      as: "${1}_per_second"
    metricsQuery: sum(rate(<<.Series>>{<<.LabelMatchers>>}[2m])) by (<<.GroupBy>>)
  - seriesQuery: '{__name__=~"^container_.*",container!="POD",namespace!="",pod!=""}'
    resources: {template: <<.Resource>>}
    metricsQuery: sum(rate(<<.Series>>{<<.LabelMatchers>>}[5m])) by (<<.GroupBy>>)
  - seriesQuery: 'gpu_jobs_waiting{namespace!=""}'
    seriesFilters:
      - is: "^inference_.*"
    resources: {template: <<.Resource>>}
    metricsQuery: sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)
  - seriesQuery: 'kube_deployment_spec_replicas{namespace!=""}'
    resources:
      overrides:
        namespace: {resource: namespace}
        deployment: {group: apps, resource: deployment}
        cronjob: {group: batch, resource: cronjob}
    metricsQuery: max(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)
  - seriesQuery: 'nv_inference_queue_duration_us{namespace!="",pod!=""}'
    resources: {template: <<.Resource>>}
    metricsQuery: '{{ if true }}<<.Series>>{{ end }}'
externalRules:
  - seriesQuery: 'inference_queue_depth{namespace!=""}'
    resources:
      overrides:
        namespace: {resource: namespace}
    name:
      matches: "^(.*)$"
      as: "${1}_total"
    metricsQuery: sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)
resourceRules:
  cpu:
    containerQuery: sum(rate(container_cpu_usage_seconds_total{<<.LabelMatchers>>}[3m])) by (<<.GroupBy>>)
    nodeQuery: sum(rate(container_cpu_usage_seconds_total{<<.LabelMatchers>>, id='/'}[3m])) by (<<.GroupBy>>)
    resources: {overrides: {node: {resource: node}, namespace: {resource: namespace}, pod: {resource: pod}}}
    containerLabel: container
  window: 3m
"""


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "prometheus-adapter.yaml"
    path.write_text(PROMETHEUS_ADAPTER)
    return path


def test_rules_become_entries_with_our_placeholders() -> None:
    conv = convert(yaml.safe_load(PROMETHEUS_ADAPTER), source="x")
    metrics = {m["name"]: m for m in conv.metrics}
    assert list(metrics) == [
        "gpu_utilization",
        "DCGM_FI_DEV_FB_USED",
        "http_requests_per_second",
        "kube_deployment_spec_replicas",
    ]
    gpu = metrics["gpu_utilization"]
    assert gpu["series"] == "DCGM_FI_DEV_GPU_UTIL"
    assert gpu["resources"] == {
        "namespaces": "exported_namespace",
        "pods": "exported_pod",
        "nodes": "Hostname",
    }
    assert gpu["query"] == "avg(DCGM_FI_DEV_GPU_UTIL{<<matchers>>}) by (<<by>>)"
    assert metrics["DCGM_FI_DEV_FB_USED"]["resources"] == {
        "namespaces": "namespace",
        "pods": "pod",
        "nodes": "node",
    }
    assert (
        metrics["http_requests_per_second"]["query"]
        == "sum(rate(http_requests_total{<<matchers>>}[2m])) by (<<by>>)"
    )
    assert metrics["kube_deployment_spec_replicas"]["resources"] == {
        "namespaces": "namespace",
        "deployments.apps": "deployment",
    }
    assert conv.external == [
        {
            "name": "inference_queue_depth_total",
            "series": "inference_queue_depth",
            "query": "sum(inference_queue_depth{<<matchers>>}) by (<<by>>)",
            "namespaceLabel": "namespace",
        }
    ]


def test_what_cannot_be_expressed_is_one_line_each() -> None:
    notes = convert(yaml.safe_load(PROMETHEUS_ADAPTER), source="x").notes
    assert len(notes) == 5, notes
    assert all("\n" not in n for n in notes)
    assert notes[0].startswith("rules[3].seriesQuery") and "name pattern" in notes[0]
    assert notes[1] == "rules[4]: seriesFilters exclude gpu_jobs_waiting; nothing to convert"
    assert notes[2].startswith("rules[5].resources.overrides.cronjob: resource 'cronjob'")
    assert notes[3].startswith("rules[6].metricsQuery uses '{{'")
    assert notes[4].startswith("resourceRules:") and "metrics-server" in notes[4]


def test_converted_file_loads_and_renders_the_same_promql(
    source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "gpupilot-adapter.yaml"
    assert main(["convert-config", str(source), "-o", str(out)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 6 and err[-1].startswith(f"wrote {out}: 4 metric(s), 1 external")
    assert all(line.startswith(f"convert-config: {source}: ") for line in err[:5])
    config = load_config(out)
    rule = config.by_name["gpu_utilization"]
    promql = render_query(
        rule.query,
        series=rule.series,
        matchers=['exported_namespace="ai-serving"', 'exported_pod=~"llm-.*"'],
        by="exported_pod",
        max_age=0,
    )
    assert promql.startswith(
        'avg(DCGM_FI_DEV_GPU_UTIL{exported_namespace="ai-serving", exported_pod=~"llm-.*"}) by (exported_pod)'
    )
    assert config.by_name["http_requests_per_second"].window_seconds == 120


def test_to_standard_output(source: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["convert-config", str(source)]) == 0
    doc = yaml.safe_load(capsys.readouterr().out)
    assert len(doc["metrics"]) == 4 and len(doc["external"]) == 1


@pytest.mark.parametrize(
    ("text", "code", "message"),
    [
        ("rules: [1, 2", 2, "not valid YAML at line"),
        ("- a\n- b\n", 2, "top level must be a mapping"),
        (
            "rules:\n  - seriesQuery: '{__name__=~\"x.*\"}'\n    metricsQuery: x\n",
            1,
            "no rule could be converted",
        ),
    ],
)
def test_bad_input_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, code: int, message: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    assert main(["convert-config", str(path)]) == code
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert main(["convert-config", str(tmp_path / "missing.yaml")]) == 2
    assert "cannot read it" in capsys.readouterr().err


def test_our_config_refusing_go_placeholders_points_at_convert_config(tmp_path: Path) -> None:
    from adapter.errors import ConfigError  # noqa: PLC0415

    path = tmp_path / "c.yaml"
    path.write_text("metrics:\n  - name: x\n    series: x\n    query: sum(<<.Series>>{<<.LabelMatchers>>})\n")
    with pytest.raises(ConfigError, match="convert-config"):
        load_config(path)


@pytest.mark.parametrize(("levels", "width"), [(9, 9), (12, 6)])
def test_an_alias_bomb_is_refused_by_the_bounded_reader(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], levels: int, width: int
) -> None:
    """A few hundred bytes of nested aliases (464 bytes took 4-7 s and 410 MB, 510 bytes 69 s and
    3.1 GB, ending in tracebacks): one line naming the file and the limit, at once."""
    import resource  # noqa: PLC0415
    import time  # noqa: PLC0415

    from tests.common.test_yamlsafe import alias_bomb  # noqa: PLC0415

    path = tmp_path / "adapter.yaml"
    path.write_text("rules:\n- seriesQuery: up\n" + alias_bomb(levels, width))
    assert len(path.read_bytes()) < 600
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.monotonic()
    assert main(["convert-config", str(path)]) == 2
    assert time.monotonic() - started < 5
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100_000  # KiB
    (line,) = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert str(path) in line and "aliases expand to more than" in line and "Traceback" not in line
