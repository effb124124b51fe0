"""rules/: promtool check and unit tests pass, every alert is documented, linked and tested firing.

promtool is the selected Prometheus's (``$GPUPILOT_PROMETHEUS``: Debian's 2.42 in ``make test``,
3.13 and 3.16 in ``make compat``)."""

from __future__ import annotations

import functools
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
RULE_FILES = sorted((REPO / "rules").glob("*.rules.yaml"))
TEST_FILES = sorted((REPO / "rules" / "tests").glob("*.test.yaml"))
RUNBOOKS = REPO / "docs" / "runbooks"
RULES_GUIDE = REPO / "docs" / "rules.md"
RUNBOOK_PREFIX = "https://github.com/gpupilot/gpupilot/blob/main/docs/runbooks/"
AGREED_RECORDS = {
    "gpupilot:pod_gpu_utilization:percent",
    "gpupilot:slice_activity:avg5m",
    "gpupilot:node_slices:allocated",
    "gpupilot:node_slices:idle",
    "gpupilot:node_slices:total",
    "gpupilot:fleet_waste:gpu_equivalents",
}
SEED_INTENT = {
    "GPUHighTemperature",
    "GPUMemoryPressure",
    "GPUDoubleBitECCErrors",
    "GPUXidError",
    "GPULowUtilization",
    "GPUDriverVersionMismatch",
    "GPUExporterDown",
    "GPUExporterSnapshotStale",
    "GPUExporterBackendDown",
    "GPUExporterProcessesHidden",  # issue 18: process counts withheld without the host PID namespace
    "GPUAdapterCertificateExpiring",  # issue 38: the adapter's serving certificate, two weeks ahead
    "GPULost",
    "GPURowRemapFailure",
    "MIGSliceIdle24h",
    "MIGReconfigurationFailed",
    "HPAAtMaxReplicasGPUBusy",
    # issue 49: gpupilot watching itself
    "GPUExporterNVMLErrors",
    "GPUAdapterPrometheusUnreachable",
    "GPUAdapterValuesStale",
    "GPURightsizerPlanStale",
    "GPURightsizerReportStale",
    "GPURightsizerApplyFailed",
    "GPURightsizerRollbackFailed",
    "GPURightsizerReportPushFailing",
}


def _rules(kind: str) -> list[dict[str, Any]]:
    out = []
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            out += [r for r in group["rules"] if kind in r]
    return out


ALERTS = _rules("alert")


def _promtool() -> str:
    from devkit.prometheus import require_binaries  # noqa: PLC0415

    return require_binaries()[1]


def test_promtool_check_rules() -> None:
    res = subprocess.run(
        [_promtool(), "check", "rules", *map(str, RULE_FILES)], capture_output=True, text=True, check=False
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count("SUCCESS") == len(RULE_FILES)


@pytest.mark.slow
def test_promtool_unit_tests_pass() -> None:
    res = subprocess.run(
        [_promtool(), "test", "rules", *map(str, TEST_FILES)], capture_output=True, text=True, check=False
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "FAILED" not in res.stdout + res.stderr


def test_promtool_unit_tests_can_fail(tmp_path: Path) -> None:
    """A wrong expectation is reported: the unit tests are not vacuous."""
    text = (REPO / "rules" / "tests" / "recording.test.yaml").read_text()
    text = text.replace("rule_files:\n  - ../", f"rule_files:\n  - {REPO / 'rules'}/").replace(
        "  - ../recording-fleet", f"  - {REPO / 'rules'}/recording-fleet"
    )
    broken = text.replace("value: 29.6875", "value: 30", 1)
    assert broken != text
    (tmp_path / "broken.test.yaml").write_text(broken)
    res = subprocess.run(
        [_promtool(), "test", "rules", str(tmp_path / "broken.test.yaml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode != 0
    assert "gpupilot:pod_gpu_utilization:percent" in res.stdout + res.stderr


def test_the_agreed_recording_rules_exist() -> None:
    assert {r["record"] for r in _rules("record")} >= AGREED_RECORDS


def test_alert_set_covers_the_issue() -> None:
    assert {a["alert"] for a in ALERTS} == SEED_INTENT


@pytest.mark.parametrize("alert", ALERTS, ids=[a["alert"] for a in ALERTS])
def test_alert_is_annotated_and_links_its_runbook(alert: dict[str, Any]) -> None:
    ann = alert.get("annotations", {})
    for key in ("summary", "description", "runbook_url"):
        assert str(ann.get(key, "")).strip(), f"{alert['alert']}: no {key}"
    assert ann["runbook_url"] == f"{RUNBOOK_PREFIX}{alert['alert'].lower()}.md", "one page per alert"
    page = RUNBOOKS / f"{alert['alert'].lower()}.md"
    assert page.is_file(), f"{alert['alert']}: no runbook page {page.relative_to(REPO)}"
    assert page.read_text().startswith(f"# {alert['alert']}\n"), f"{page.name}: not titled with the alert"
    assert alert["labels"]["severity"] in {"critical", "warning", "info"}


@functools.cache
def _cases() -> tuple[dict[str, int], dict[str, int]]:
    """Alert name → number of unit-test evaluations expecting it to fire, and expecting silence."""
    firing: dict[str, int] = {}
    quiet: dict[str, int] = {}
    for path in TEST_FILES:
        doc = yaml.safe_load(path.read_text())
        if "../alerts.rules.yaml" not in doc["rule_files"]:
            continue  # seed.test.yaml replays the seed's rules, whose names overlap ours
        for test in doc.get("tests", []):
            for case in test.get("alert_rule_test", []):
                counts = firing if case.get("exp_alerts") else quiet
                counts[case["alertname"]] = counts.get(case["alertname"], 0) + 1
    return firing, quiet


@pytest.mark.parametrize("name", sorted(SEED_INTENT))
def test_every_alert_has_a_firing_and_a_quiet_unit_test(name: str) -> None:
    firing, quiet = _cases()
    assert firing.get(name, 0) >= 1, f"{name}: no unit test where it fires"
    assert quiet.get(name, 0) >= 1, f"{name}: no unit test where it stays quiet"


def test_the_guide_counts_the_alerts() -> None:
    """docs/rules.md says how many alerts rules/alerts.rules.yaml holds: the number is right."""
    (count,) = re.findall(r"`rules/alerts\.rules\.yaml` \| (\d+) alerts", RULES_GUIDE.read_text())
    assert int(count) == len(ALERTS)


def test_comparison_table_names_all_six_example_rules() -> None:
    text = RULES_GUIDE.read_text()
    table = text[text.index("## Typical hand-written rules") :]
    for seed_rule in (
        "GPUHighTemperature",
        "GPUMemoryPressure",
        "GPUECCErrors",
        "GPUXidErrors",
        "GPULowUtilization",
        "GPUDriverMismatch",
    ):
        assert f"`{seed_rule}`" in table


def test_seed_replay_shows_each_fault() -> None:
    """seed.test.yaml loads only the seed's rules and records a false or missed alarm for all six."""
    doc = yaml.safe_load((REPO / "rules" / "tests" / "seed.test.yaml").read_text())
    assert doc["rule_files"] == ["seed/gpu-alerts.yaml"]
    named = {case["alertname"] for test in doc["tests"] for case in test["alert_rule_test"]}
    assert named == {
        "GPUHighTemperature",
        "GPUMemoryPressure",
        "GPUECCErrors",
        "GPUXidErrors",
        "GPULowUtilization",
        "GPUDriverMismatch",
    }
    seed_rules = yaml.safe_load((REPO / "rules" / "tests" / "seed" / "gpu-alerts.yaml").read_text())
    assert len(seed_rules["groups"][0]["rules"]) == 6


_DURATION = re.compile(r"(\d+)(ms|[smhdwy])")
_UNIT_MS = {
    "ms": 1,
    "s": 1000,
    "m": 60_000,
    "h": 3_600_000,
    "d": 86_400_000,
    "w": 604_800_000,
    "y": 31_536_000_000,
}
_RANGE = re.compile(r"\[((?:\d+(?:ms|[smhdwy]))+)(:[^\]]*)?\]")
"""A range selector's or a subquery's window (``[5m]``, ``[4m59s999ms]``, ``[24h:1h]``)."""


def _ms(duration: str) -> int:
    return sum(int(n) * _UNIT_MS[unit] for n, unit in _DURATION.findall(duration))


def _whole(expr: str) -> str:
    """``expr`` with each window written a millisecond short given at its length (``[23h59m59s999ms]``
    → ``[24h]``), in whole hours or minutes, so the checks below read the window meant."""

    def whole(m: re.Match[str]) -> str:
        ms = _ms(m[1]) + 1
        if ms % 60_000:
            return m[0]
        unit = "h" if ms % _UNIT_MS["h"] == 0 else "m"
        return f"[{ms // _UNIT_MS[unit]}{unit}{m[2] or ''}]"

    return _RANGE.sub(whole, expr)


_WINDOW = re.compile(r"(gpupilot:[a-z_:0-9]+)(\{[^}]*\})?\[(\d+)([hdw])\]")
"""A recording rule's series read over a window of hours or more."""

_HOURLY = re.compile(
    r"count_over_time\(\s*count_over_time\((gpupilot:[a-z_:0-9]+)(?:\{[^}]*\})?\[1h\]\)"
    r"\[(\d+)h:1h\]\s*\)\s*>=\s*(\d+)"
)
"""The clause that requires a sample of the series in each hour of a window of N hours."""


def _coverage_guards(expr: str) -> set[tuple[str, str]]:
    """(series, offset) pairs an expression requires to exist in the past: ``series offset W``
    outside any range selector."""
    return set(re.findall(r"(gpupilot:[a-z_:0-9]+)(?:\{[^}]*\})?\s+offset\s+(\d+[hdw])", expr))


def _hourly_coverage(expr: str) -> set[tuple[str, str]]:
    """(series, window) pairs an expression requires a sample of in every hour of the window."""
    return {(series, f"{hours}h") for series, hours, need in _HOURLY.findall(expr) if need == hours}


def _hours(n: str, unit: str) -> int:
    return int(n) * {"h": 1, "d": 24, "w": 168}[unit]


@pytest.mark.parametrize("alert", ALERTS, ids=[a["alert"] for a in ALERTS])
def test_an_alert_over_a_window_of_a_rule_requires_the_rule_to_cover_it(alert: dict[str, Any]) -> None:
    """A recording rule installed today over old raw history has minutes of samples: an alert that
    reads it over 24 h (or 7 d) must also require the rule's series to reach that far back, and to
    have a sample in every hour between (a gap of 23 h 40 min between two idle ends is no idle day).
    The hourly clause's own one-hour windows are what it counts."""
    expr = _whole(alert["expr"])
    hourly = _hourly_coverage(expr)
    for series, _matchers, n, unit in _WINDOW.findall(expr):
        if f"{n}{unit}" == "1h" and any(s == series for s, _ in hourly):
            continue
        assert (series, f"{n}{unit}") in _coverage_guards(expr), (
            f"{alert['alert']} reads {series} over {n}{unit} without requiring it to exist {n}{unit} ago"
        )
        assert (series, f"{_hours(n, unit)}h") in hourly, (
            f"{alert['alert']} reads {series} over {n}{unit} without requiring a sample in every hour"
        )
        page = (RUNBOOKS / f"{alert['alert'].lower()}.md").read_text()
        assert "history" in page.lower() and "recording rule" in page.lower(), (
            f"{alert['alert']}: the runbook does not say the alert waits for the rule's history"
        )
        assert "every hour" in page.lower(), f"{alert['alert']}: the runbook does not say gaps keep it quiet"


def test_every_rule_window_is_a_millisecond_short() -> None:
    """Range windows one millisecond short of their length take the same samples on Prometheus 2
    (closed windows) and 3 (left-open); a full-length window, or a subquery's, is named here."""
    full = []
    for kind in ("record", "alert"):
        for rule in _rules(kind):
            for m in _RANGE.finditer(rule["expr"]):
                if not m[2] and (_ms(m[1]) + 1) % 60_000:
                    full.append(f"{rule[kind]}: [{m[1]}]")
    assert not full, full
    assert _whole("x[23h59m59s999ms]") == "x[24h]" and _whole("x[4m59s999ms]") == "x[5m]"
    assert _whole("count_over_time(x[59m59s999ms])[24h:1h]") == "count_over_time(x[1h])[24h:1h]"


def test_the_window_check_sees_an_unguarded_alert() -> None:
    unguarded = 'max_over_time(gpupilot:slice_activity:avg5m{pod!=""}[24h]) < 0.05'
    assert _WINDOW.findall(unguarded) and not _coverage_guards(unguarded)
    assert not _hourly_coverage(unguarded)
    guarded = unguarded + ' and on (pod) gpupilot:slice_activity:avg5m{pod!=""} offset 24h'
    covered = guarded + (
        ' and on (pod) count_over_time(count_over_time(gpupilot:slice_activity:avg5m{pod!=""}[1h])[24h:1h]) >= 24'
    )
    assert _hourly_coverage(covered) == {("gpupilot:slice_activity:avg5m", "24h")}
    assert not _hourly_coverage(covered.replace(">= 24", ">= 2"))  # two hours of 24 are not a day
    assert _coverage_guards(guarded) == {("gpupilot:slice_activity:avg5m", "24h")}
