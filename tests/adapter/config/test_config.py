"""The metric mapping file: the packaged defaults, and one-line errors naming file and field."""

from pathlib import Path

import pytest

from adapter.cli import main
from adapter.config import resources
from adapter.config.mapping import load_config, parse_config
from adapter.errors import ConfigError


def test_default_config_serves_the_dcgm_and_application_metrics() -> None:
    cfg = load_config(None)
    names = {m.name for m in cfg.metrics}
    assert {
        "DCGM_FI_DEV_GPU_UTIL",
        "gpu_utilization",
        "gpu_memory_used_bytes",
        "inference_queue_depth",
    } <= names
    assert cfg.metric("gpu_utilization").series == "gpupilot:pod_gpu_utilization:percent"  # type: ignore[union-attr]
    util = cfg.metric("DCGM_FI_DEV_GPU_UTIL")
    assert util is not None
    assert util.label_for(resources.PODS) == "pod"
    assert util.label_for(resources.NODES) == "Hostname"
    assert util.window_seconds == 60
    assert cfg.external_metric("gpupilot_fleet_waste_gpu_equivalents") is not None


@pytest.mark.parametrize(
    ("extra", "seconds"),
    [
        ("    query: 'sum by (<<by>>) (rate(<<series>>{<<matchers>>}[5m]))'\n", 300),
        ("    query: 'max_over_time(<<series>>{<<matchers>>}[1h30m:1m])'\n", 5400),
        ("    query: 'rate(<<series>>{<<matchers>>}[2m]) + rate(<<series>>{<<matchers>>}[30s])'\n", 120),
        ("    query: 'rate(<<series>>{<<matchers>>}[5m])'\n    window: 45s\n", 45),
        ("", 60),
    ],
)
def test_window_seconds_follow_the_query(tmp_path: Path, extra: str, seconds: int) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("metrics:\n  - name: x\n" + extra + "external:\n  - name: e\n" + extra)
    cfg = load_config(f)
    assert cfg.metric("x").window_seconds == seconds  # type: ignore[union-attr]
    assert cfg.external_metric("e").window_seconds == seconds  # type: ignore[union-attr]


def test_rename_and_defaults(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("defaults: {window: 2m}\nmetrics:\n  - name: gpu_busy\n    series: DCGM_FI_DEV_GPU_UTIL\n")
    rule = load_config(f).metric("gpu_busy")
    assert rule is not None
    assert rule.series == "DCGM_FI_DEV_GPU_UTIL"
    assert rule.window_seconds == 120
    assert rule.query == "avg by (<<by>>) (<<series>>{<<matchers>>})"
    assert set(rule.labels) == {resources.PODS, resources.NAMESPACES}


@pytest.mark.parametrize(
    ("text", "line", "where", "what"),
    [
        (
            "metrics:\n  - name: x\n    resources: {pdos: pod, namespaces: namespace}\n",
            3,
            "metrics[0].resources.pdos",
            "unknown resource",
        ),
        (
            "metrics:\n  - name: x\n    query: 'sum(<<serie>>)'\n",
            3,
            "metrics[0].query",
            "unknown placeholder <<serie>>",
        ),
        ("metrics:\n  - name: x\n  - name: x\n", 3, "metrics[1].name", "defined twice"),
        ("metrics:\n  - series: y\n", 2, "metrics[0].name", "is required"),
        ("metrics:\n  - name: x\n    window: soon\n", 3, "metrics[0].window", "not a duration"),
        ("metrics:\n  - name: x\n    colour: red\n", 3, "metrics[0].colour", "unknown field"),
        (
            "metrics:\n  - name: x\n    resources: {pods: pod}\n",
            3,
            "metrics[0].resources",
            "need a 'namespaces' label",
        ),
        ("metrics:\n  - name: x\n    query: 'sum(x{<<matchers>>}'\n", 3, "metrics[0].query", "unbalanced"),
        ("metrics: {name: x}\n", 1, "metrics", "must be a list"),
        (
            "external:\n  - name: e\n    namespaceLabel: 'bad label'\n",
            3,
            "external[0].namespaceLabel",
            "not a Prometheus label",
        ),
        ("metrics: []\n", 1, "metrics", "no metrics defined"),
        (
            "metrics:\n  - name: x\n    query: 'sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)'\n",
            3,
            "metrics[0].query",
            "<<.Series>> is a prometheus-adapter template placeholder; this format writes <<series>> instead",
        ),
        (
            "external:\n  - name: e\n    query: 'sum(x{<< .LabelMatchers >>})'\n",
            3,
            "external[0].query",
            "writes <<matchers>> instead",
        ),
    ],
)
def test_errors_name_file_line_and_field(tmp_path: Path, text: str, line: int, where: str, what: str) -> None:
    f = tmp_path / "adapter.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(f)
    message = str(err.value)
    assert message.startswith(f"{f}:{line}: {where}: ")
    assert what in message
    assert "\n" not in message


def test_yaml_syntax_error_names_the_line(tmp_path: Path) -> None:
    f = tmp_path / "adapter.yaml"
    f.write_text("metrics:\n  - name: x\n   bad: indent\n")
    with pytest.raises(ConfigError) as err:
        load_config(f)
    assert str(err.value).startswith(f"{f}:3: ")
    assert str(err.value).endswith("(YAML syntax)")


def test_loaded_data_without_a_file_names_the_source_and_field() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"metrics": [{"name": "x"}, "y"]}, source="ConfigMap c")
    assert str(err.value) == "ConfigMap c: metrics[1]: must be a mapping with at least 'name', got 'y'"


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "nope.yaml")


def test_cli_reports_a_bad_config_in_one_line_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "adapter.yaml"
    f.write_text("metrics:\n  - name: x\n    resources: {pdos: pod}\n")
    code = main(
        [
            "serve",
            "--prometheus-url",
            "http://127.0.0.1:9",
            "--config",
            str(f),
            "--pod-source",
            "none",
            "--authorization-mode",
            "none",
            "--self-signed-cert-dir",
            str(tmp_path / "tls"),
        ]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.count("\n") == 0
    assert f"{f}:3: metrics[0].resources.pdos: unknown resource" in err
    assert "Traceback" not in err


def test_cli_requires_tls(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "serve",
            "--prometheus-url",
            "http://127.0.0.1:9",
            "--pod-source",
            "none",
            "--authorization-mode",
            "none",
        ]
    )
    assert code == 2
    assert "TLS is required" in capsys.readouterr().err
