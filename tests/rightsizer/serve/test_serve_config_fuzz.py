"""The serve config's fields, each given values of every type (and hostile strings): parse either
accepts the document or refuses it with one ServeConfigError line naming the field — never another
exception, never a traceback. And `serve --check` refuses, in one line, a Prometheus (or Kubernetes
API) that does not answer."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devkit.prometheus import free_port
from rightsizer.cli import main
from rightsizer.serve.config import ServeConfigError, load, parse

BASE: dict[str, Any] = {
    "prometheus_url": "http://127.0.0.1:9090",
    "timezone": "UTC",
    "report": {"schedule": "mon 06:00"},
    "plan": {"every": "6h"},
    "auto_apply": {
        "enabled": True,
        "maintenance_window": {"days": ["sat"], "start": "01:00", "end": "05:00"},
        "leader_election": {"namespace": "gpupilot", "lease_duration": "15s"},
    },
}
FIELDS: tuple[tuple[str, ...], ...] = (
    ("prometheus_url",),
    ("timezone",),
    ("listen",),
    ("state_dir",),
    ("prometheus_tenant",),
    ("prometheus_password_file",),
    ("report",),
    ("report", "schedule"),
    ("report", "window"),
    ("report", "price_per_gpu_hour"),
    ("report", "out_dir"),
    ("report", "hpa_recommendations"),
    ("plan",),
    ("plan", "every"),
    ("plan", "window"),
    ("plan", "max_nodes"),
    ("plan", "headroom"),
    ("plan", "idle_threshold"),
    ("plan", "min_busy"),
    ("auto_apply",),
    ("auto_apply", "enabled"),
    ("auto_apply", "maintenance_window"),
    ("auto_apply", "maintenance_window", "days"),
    ("auto_apply", "maintenance_window", "start"),
    ("auto_apply", "max_nodes_per_day"),
    ("auto_apply", "min_gpus_freed"),
    ("auto_apply", "check_every"),
    ("auto_apply", "kubeconfig"),
    ("auto_apply", "max_parallel"),
    ("auto_apply", "max_plan_age"),
    ("auto_apply", "operator_namespace"),
    ("auto_apply", "mig_configmap"),
    ("auto_apply", "repoint_cluster_policy"),
    ("auto_apply", "configmap_sync"),
    ("auto_apply", "lease_duration"),
    ("auto_apply", "leader_election"),
    ("auto_apply", "leader_election", "namespace"),
    ("auto_apply", "leader_election", "lease_duration"),
)
HOSTILE = st.sampled_from(
    [
        "",
        " ",
        "E" * 300,
        "../" * 40,
        "\x00",
        "a\nb",
        "1e309",
        "nan",
        "-1",
        "0",
        "99999999999999999999d",
        "Etc/../../etc/passwd",
    ]
)
VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from([math.nan, math.inf, -math.inf])
    | st.text(max_size=40)
    | HOSTILE,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=5,
)


def with_value(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(yaml.safe_dump(BASE))  # a deep copy
    node = doc
    for key in path[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node[path[-1]] = value
    return doc


@pytest.mark.slow
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(path=st.sampled_from(FIELDS), value=VALUES)
def test_any_value_in_any_field_is_accepted_or_refused_in_one_line(path: tuple[str, ...], value: Any) -> None:
    try:
        parse(with_value(path, value), source="serve.yaml")
    except ServeConfigError as exc:
        text = str(exc)
        assert text.startswith("serve.yaml: ") and "\n" not in text and len(text) < 1000, text


def test_a_300_character_timezone_is_one_line() -> None:
    with pytest.raises(ServeConfigError) as err:
        parse(with_value(("timezone",), "Europe/" + "B" * 300), source="serve.yaml")
    assert str(err.value).startswith(
        "serve.yaml: timezone: 'Europe/BBB"
    ) and "is not an IANA time zone" in str(err.value)


def test_a_file_name_too_long_to_look_up_is_one_line() -> None:
    """The system refuses to look a 300-character name up (ENAMETOOLONG) rather than say it is missing."""
    with pytest.raises(ServeConfigError) as err:
        parse(with_value(("prometheus_password_file",), "E" * 300), source="serve.yaml")
    assert str(err.value).startswith("serve.yaml: prometheus_password_file: 'EEE") and "no such file" in str(
        err.value
    )


def write(tmp_path: Path, **auto_apply: Any) -> Path:
    doc = {
        "prometheus_url": f"http://127.0.0.1:{free_port()}",  # nothing listens there
        "timezone": "UTC",
        "state_dir": str(tmp_path / "state"),
        "plan": {"every": "6h"},
    }
    if auto_apply:
        doc["auto_apply"] = auto_apply
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_check_fails_in_one_line_when_prometheus_does_not_answer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path)
    assert main(["serve", "--config", str(path), "--check"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(
        "error: cannot reach Prometheus at http://127.0.0.1:"
    )
    assert f"check prometheus_url in {path}" in err and "--prometheus-url" not in err
    # --offline: the file only (CI, a machine without the cluster)
    assert main(["serve", "--config", str(path), "--check", "--offline"]) == 0
    assert "plan: next run" in capsys.readouterr().out


@pytest.mark.prometheus
def test_check_with_auto_apply_also_needs_the_kubernetes_api(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from devkit.prometheus import PrometheusServer  # noqa: PLC0415
    from tests.support.kubedouble import KubeDouble  # noqa: PLC0415

    with PrometheusServer(tmp_path / "prom") as prom, KubeDouble() as kube:
        kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig")
        guard = {"enabled": True, "maintenance_window": {"start": "01:00", "end": "05:00"}}
        path = write(tmp_path, **guard, kubeconfig=str(kubeconfig))
        text = path.read_text().replace(yaml.safe_load(path.read_text())["prometheus_url"], prom.url)
        path.write_text(text)
        assert main(["serve", "--config", str(path), "--check"]) == 0
        assert "auto_apply: next run" in capsys.readouterr().out
        kube.stop()  # the API goes away
        assert main(["serve", "--config", str(path), "--check"]) == 1
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("error: the Kubernetes API for auto_apply:")


@pytest.mark.parametrize("namespace", ["a/b", "Bad_NS!", "gpupilot\n", "-lead", "x" * 64, "..", ""])
def test_check_refuses_a_leader_election_namespace_that_is_not_a_dns_label(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], namespace: str
) -> None:
    path = write(tmp_path, leader_election={"namespace": namespace})
    assert main(["serve", "--config", str(path), "--check", "--offline"]) == 2  # a config error
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"error: {path}:") and "auto_apply.leader_election.namespace:" in err
    assert "Traceback" not in err


def test_check_takes_a_leader_election_namespace_that_is_a_dns_label(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, leader_election={"namespace": "gpu-pilot-0", "lease_duration": "15s"})
    assert main(["serve", "--config", str(path), "--check", "--offline"]) == 0


def test_the_report_job_takes_folders_of_hpa_recommendations(tmp_path: Path) -> None:
    path = tmp_path / "serve.yaml"
    doc = yaml.safe_load(yaml.safe_dump(BASE))
    doc["report"]["hpa_recommendations"] = [str(tmp_path / "hpa"), str(tmp_path / "one.json")]
    path.write_text(yaml.safe_dump(doc))
    config = load(path)
    assert config.report is not None
    assert config.report.hpa_recommendations == (tmp_path / "hpa", tmp_path / "one.json")
    doc["report"]["hpa_recommendations"] = [7]
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(
        ServeConfigError, match=r"report\.hpa_recommendations\[0\]: must be a file or folder path"
    ):
        load(path)
