"""The weekly report from a week of backfilled history: charts are real pictures, the plan's numbers
appear in the HTML and Markdown, alerts from ALERTS are listed; plus its command-line errors."""

from __future__ import annotations

import csv
import errno
import io
import os
import re
import time
from collections import Counter
from dataclasses import replace

import pytest
from PIL import Image

from gpupilot_common import atomicfile
from gpupilot_common.text import plural
from rightsizer.cli import main
from rightsizer.clients.prometheus import PrometheusClient
from rightsizer.plan.model import load_plan
from rightsizer.plan.settings import PlanSettings
from rightsizer.report import charts
from rightsizer.report import data as data_api
from rightsizer.report.build import build_report, generate, write_report
from rightsizer.serve import status
from rightsizer.serve.scheduler import idle_slices
from rightsizer.serve.state import State
from tests.support.rightsizer.apply_support import Change, make_plan
from tests.support.rightsizer.report_support import plan_with_evidence, report_data, synthetic_report

PRICE = 2.5


def pixel_spread(png: bytes) -> float:
    """Standard deviation of the grey levels: ~0 for a blank image."""
    hist = Image.open(io.BytesIO(png)).convert("L").histogram()
    n = sum(hist)
    mean = sum(i * c for i, c in enumerate(hist)) / n
    return float((sum(c * (i - mean) ** 2 for i, c in enumerate(hist)) / n) ** 0.5)


@pytest.fixture(scope="module")
def weekly_report(metrics_history, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    plan_file = out / "plan.json"
    end = metrics_history.end
    code = main(
        [
            "plan",
            "--prometheus-url",
            metrics_history.url,
            "--at",
            str(end),
            "--out",
            str(plan_file),
            "--time-limit",
            "10",
        ]
    )
    assert code == 0
    with PrometheusClient(metrics_history.url) as client:
        written = generate(
            client,
            out=out,
            end=end,
            settings=PlanSettings(window_s=7 * 86400),
            price=PRICE,
            plan=load_plan(plan_file),
        )
    return written, load_plan(plan_file)


@pytest.mark.prometheus
def test_charts_are_non_empty_pictures(weekly_report):
    written, _ = weekly_report
    names = {p.name for p in written.images}
    assert {"trend.png", "heatmap.png", "top-idle.png"} <= names
    for path in written.images:
        png = path.read_bytes()
        assert len(png) > 8000, path
        assert pixel_spread(png) > 10, path


@pytest.mark.prometheus
def test_plan_numbers_appear_in_html_and_markdown(weekly_report):
    written, plan = weekly_report
    html = written.html.read_text()
    md = written.markdown.read_text()
    assert plan.plan_id in html and plan.plan_id in md
    freed = plan.totals.gpus_freed
    hours = freed * 168
    for text in (html, md):
        assert (
            f"free {plural(freed, 'GPU')}: {hours:,.0f} GPU-hours a week" in text
            if freed
            else "No node needs a change" in text
        )
        if freed:
            assert f"{hours * PRICE:,.0f} a week" in text
    for node in plan.changed_nodes:
        assert node.name in html and node.config_name in md
    assert html.count("data:image/png;base64,") == len(written.images)  # self-contained
    assert not re.search(r"src=['\"](?!data:)", html)


@pytest.mark.prometheus
def test_alerts_from_the_alerts_series_are_listed(metrics_history, tmp_path, capsys):
    """ALERTS is whatever Prometheus evaluated; the report lists each alert that fired, or says none did.
    The command names each file it wrote once (``wrote PATH``), and only those."""
    with PrometheusClient(metrics_history.url) as client:
        now = time.time()
        firing = client.instant('count by (alertname) (max_over_time(ALERTS{alertstate="firing"}[7d]))', now)
    md = (tmp_path / "x").as_posix()
    code = main(
        [
            "report",
            "--prometheus-url",
            metrics_history.url,
            "--out",
            md,
            "--at",
            str(now),
        ]
    )
    assert code == 0
    captured = capsys.readouterr()
    wrote = [line for line in (captured.out + captured.err).splitlines() if line.startswith("wrote ")]
    files = sorted(p for p in (tmp_path / "x").iterdir() if p.is_file())
    assert sorted(wrote) == sorted(f"wrote {p}" for p in files) and "namespaces.csv" in str(wrote)
    text = (tmp_path / "x" / "report.md").read_text()
    if firing:
        for sample in firing:
            assert sample.labels["alertname"] in text
    else:
        assert "No alert fired in the window." in text


def test_unreachable_prometheus_is_one_line(tmp_path, capsys):
    code = main(
        ["report", "--prometheus-url", "http://127.0.0.1:9", "--out", str(tmp_path), "--timeout", "2"]
    )
    err = capsys.readouterr().err
    assert code == 1 and "cannot reach Prometheus" in err and len(err.strip().splitlines()) == 1


def test_bad_window_is_rejected_by_the_parser(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["report", "--prometheus-url", "http://x", "--out", str(tmp_path), "--window", "banana"])
    assert "not a duration" in capsys.readouterr().err


@pytest.mark.slow
def test_synthetic_week_renders_every_section_with_the_plan_numbers(tmp_path):
    written = write_report(synthetic_report(price=2.5), tmp_path)
    assert {p.name for p in written.images} == {
        "trend.png",
        "heatmap.png",
        "top-idle.png",
        "savings.png",
        "alerts.png",
    }
    assert all(pixel_spread(p.read_bytes()) > 10 for p in written.images)
    html, md = written.html.read_text(), written.markdown.read_text()
    # gpu-node-1 frees 2 GPUs, gpu-node-2 one: 3 GPUs, 504 GPU-hours a week, 1,260 at 2.5 per GPU-hour
    for text in (html, md):
        assert "free 3 GPUs: 504 GPU-hours a week, worth 1,260 a week and 65,520 a year" in text
        assert "MIGSliceIdle24h" in text and "GPUXidError" in text and "86.7 h" in text
        changes = text.split("Proposed layout changes", 1)[1].split("GPU use per namespace")[0]
        assert "gpu-node-1" in changes and "gpu-node-3" not in changes
        assert "GPU(s)" not in text and "node(s)" not in text and "1 GPUs" not in text
        assert "pods disrupted" in changes and "moved" not in changes  # the plan's word
    assert "| gpu-node-1 | H100 80GB |" in md and "| 2 | 336 | 840 |" in md
    # ml/infer-0-0: a 1g slice (1/7 of an H100) idle 168 h → 24 idle GPU-hours
    assert "<td class='k'>ml/infer-0-0</td><td>gpu-node-1</td>" in html and ">24.0<" in html


@pytest.mark.slow
def test_without_price_or_alerts_the_report_says_so(tmp_path):
    written = write_report(synthetic_report(price=None, alerts=False), tmp_path)
    html = written.html.read_text()
    assert "No alert fired in the window." in html and "per GPU-hour" not in html
    assert not (tmp_path / "alerts.png").exists()


@pytest.mark.prometheus
def test_backfilled_history_with_a_plan_that_changes_nodes(metrics_history, tmp_path):
    plan = plan_with_evidence()
    with PrometheusClient(metrics_history.url) as client:
        written = generate(
            client,
            out=tmp_path,
            end=metrics_history.end,
            settings=PlanSettings(window_s=7 * 86400),
            price=PRICE,
            plan=plan,
        )
    html = written.html.read_text()
    assert "free 3 GPUs: 504 GPU-hours a week, worth 1,260 a week" in html
    assert all(pixel_spread(p.read_bytes()) > 10 for p in written.images)
    assert {"trend.png", "heatmap.png", "savings.png", "top-idle.png"} <= {p.name for p in written.images}


@pytest.mark.prometheus
def test_history_fills_trend_and_heatmap_over_the_whole_window(metrics_history):
    """Rule results exist only since Prometheus started; the raw-series fallback covers the rest."""
    end = metrics_history.end
    with PrometheusClient(metrics_history.url) as client:
        trend = data_api.fetch_trend(client, start=end - 7 * 86400, end=end, step=1800)
        heat = data_api.fetch_heatmap(client, start=end - 7 * 86400, end=end)
    assert sum(v is not None for v in trend.total) >= 0.95 * len(trend.times)
    assert sum(v is not None for v in trend.idle) >= 0.95 * len(trend.times)
    assert max(v for v in trend.total if v is not None) > 0
    assert {"sim-h100-a", "sim-h100-b"} <= set(heat.nodes)
    cells = [v for row in heat.values for v in row]
    assert sum(v is not None for v in cells) >= 0.9 * len(cells)
    assert len({round(v, 2) for v in cells if v is not None}) > 10  # activity varies, not a constant


@pytest.mark.slow
def test_top_idle_slices_leave_out_a_slice_that_bursts():
    """Same rule as serve's gpupilot_rightsizer_idle_slices: GPU 1 has many idle hours but a burst."""
    report = synthetic_report()
    labels = [s.label for s in report.idle]
    assert labels and not any("GPU 1 " in label for label in labels)
    assert {s.node for s in report.idle} == {"gpu-node-1", "gpu-node-2"}
    # GPUs 0, 2, 3 on both nodes are idle; 0 and 2 are held by pods, 3 by none
    assert len(labels) == report.idle_pods_total == 4
    assert sum(u.devices for u in report.unallocated) == 2
    assert report.idle_pods_total + sum(u.devices for u in report.unallocated) == idle_slices(
        report.data.plan
    )
    # serve's series is the report's figures, split the same way (one run's gauge said 17 where
    # its report said "6 allocated idle": it counted the unallocated ones too)
    families = {f.name: f for f in status.metric_families(State(plan=report.data.plan), Counter())}
    by = {s.labels["allocated"]: s.value for s in families["gpupilot_rightsizer_idle_slices"].samples}
    assert by == {"true": report.idle_pods_total, "false": sum(u.devices for u in report.unallocated)}


@pytest.mark.slow
def test_the_first_table_lists_the_pods_holding_idle_gpus_by_idle_gpu_hours(tmp_path):
    written = write_report(synthetic_report(), tmp_path)
    md = written.markdown.read_text()
    sections = [line[3:] for line in md.splitlines() if line.startswith("## ")]
    assert sections[:5] == [
        "Pods holding idle GPUs",
        "Unallocated capacity",
        "Proposed layout changes",
        "Week over week",
        "GPU use per namespace",
    ]
    first = md.split("## Pods holding idle GPUs")[1].split("## ")[0]
    rows = [line.split(" | ") for line in first.splitlines() if line.startswith("| ml/")]
    hours = [float(r[3]) for r in rows]
    assert next(r[0].lstrip("| ") for r in rows) == "ml/infer-0-0"  # 168 idle hours, the most
    assert hours == sorted(hours, reverse=True) and len(rows) == 4
    assert "unallocated" not in first  # capacity no pod holds has its own section
    unallocated = md.split("## Unallocated capacity")[1].split("## ")[0]
    assert "| gpu-node-1 | H100 80GB | 1 | 0.14 |" in unallocated


@pytest.mark.slow
def test_per_namespace_table_and_csv_agree():
    report = synthetic_report(price=2.0)
    rows = list(csv.DictReader(io.StringIO(report.namespaces_csv)))
    assert [r["namespace"] for r in rows] == ["ml"]
    (ml,) = report.namespaces
    # 4 allocated 1g slices (1/7 GPU each) with data for 168 h: 96 GPU-hours allocated;
    # idle hours 168, 128 (node 1, GPUs 0 and 2), 161, 121 (node 2) → 578/7 = 82.57 idle GPU-hours
    assert ml.devices == 4 and round(ml.gpu_hours_allocated, 2) == 96.0
    assert round(ml.gpu_hours_idle, 2) == 82.57 and ml.cost == 192.0
    assert float(rows[0]["gpu_hours_idle"]) == 82.57 and float(rows[0]["cost"]) == 192.0
    assert list(rows[0]) == [
        "namespace",
        "devices",
        "gpu_hours_allocated",
        "gpu_hours_idle",
        "idle_share",
        "cost",
        "idle_cost",
    ]


@pytest.mark.slow
def test_written_report_has_the_csv_beside_it(tmp_path):
    written = write_report(synthetic_report(), tmp_path)
    assert written.csv == tmp_path / "namespaces.csv"
    assert written.csv is not None
    assert written.csv.read_text().startswith("namespace,devices,gpu_hours_allocated")
    assert "namespaces.csv" in written.html.read_text()


@pytest.mark.slow
def test_every_plan_node_has_a_heatmap_row_grey_without_data():
    data = report_data()
    no_node3 = replace(
        data.heatmap, nodes=data.heatmap.nodes[:2], values=data.heatmap.values[:2], nodes_total=2
    )
    report = build_report(replace(data, heatmap=no_node3))
    heat = report.data.heatmap
    assert heat.nodes == ("gpu-node-1", "gpu-node-2", "gpu-node-3")
    assert all(v is None for v in heat.values[2])


@pytest.mark.slow
def test_charts_carry_titles():
    """Each chart's title is drawn above it (the top band differs from the same chart untitled) and
    stored as the PNG's Title."""
    report = synthetic_report()
    untitled = charts.heatmap_chart(report.data.heatmap)
    for name, png in report.charts.items():
        image = Image.open(io.BytesIO(png))
        assert image.info.get("Title"), name
    titled = Image.open(io.BytesIO(report.charts["heatmap.png"])).convert("L")
    plain = Image.open(io.BytesIO(untitled)).convert("L")
    titled_darkest = titled.crop((0, 0, 400, 24)).getextrema()[0]  # greyscale: (darkest, lightest)
    plain_darkest = plain.crop((0, 0, 400, 24)).getextrema()[0]
    assert isinstance(titled_darkest, int) and isinstance(plain_darkest, int)
    assert titled_darkest < 100 < plain_darkest
    assert "Title" not in plain.info


@pytest.mark.prometheus
def test_trend_of_any_window_lines_up_and_time_before_the_history_is_missing(prometheus_history):
    """A 2-day window has a step of 514.29 s: points are matched by slot, not by float equality;
    time before the first sample is missing (None), never zero."""
    end = prometheus_history.end
    with PrometheusClient(prometheus_history.url) as client:
        two_days = data_api.fetch_trend(client, start=end - 2 * 86400, end=end, step=2 * 86400 / 336)
        before = data_api.fetch_trend(
            client, start=prometheus_history.start - 86400, end=prometheus_history.start + 86400, step=1800
        )
    assert sum(v is not None for v in two_days.total) >= 0.95 * len(two_days.times)
    assert sum(v is not None for v in two_days.idle) >= 0.95 * len(two_days.times)
    early = [v for t, v in zip(before.times, before.idle, strict=True) if t < prometheus_history.start - 600]
    late = [v for t, v in zip(before.times, before.idle, strict=True) if t > prometheus_history.start + 600]
    assert early and all(v is None for v in early)
    assert late and all(v is not None for v in late)


@pytest.mark.slow
def test_a_failed_write_leaves_the_previous_report_whole(tmp_path, monkeypatch):
    """A full disk while writing this week's report: last week's pages and charts stay as they
    were, with no new chart beside them, and the error says so in one line."""
    out = tmp_path / "report"
    write_report(synthetic_report(price=None, alerts=False), out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert "alerts.png" not in before

    def full(_fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(atomicfile.WriteFailed) as err:
        write_report(synthetic_report(price=2.5), out)
    assert str(err.value) == f"cannot write {out}: No space left on device; the previous one is left intact"
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["report"]
    monkeypatch.undo()
    written = write_report(synthetic_report(price=2.5), out)
    assert (out / "alerts.png").exists() and "1,260" in written.html.read_text()


@pytest.mark.slow
def test_a_plan_beside_the_report_is_kept_when_the_report_is_replaced(tmp_path):
    (tmp_path / "plan.json").write_text("{}")
    (tmp_path / "old-chart.png").write_bytes(b"last week")
    write_report(synthetic_report(price=None, alerts=False), tmp_path)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert "plan.json" in names and "old-chart.png" not in names and "report.html" in names


@pytest.mark.slow
def test_one_change_reads_in_the_singular(tmp_path):
    data = report_data()
    one = make_plan([Change("gpu-node-1", "all-1g.10gb", {"7g.80gb": 1}, gpus_freed=1)])
    report = build_report(replace(data, plan=one))
    md = write_report(report, tmp_path).markdown.read_text()
    assert "1 node changes and frees 1 GPU: 168 GPU-hours a week" in md
    assert "GPUs freed by the plan (1 node changes)" in md
    assert "1 GPUs" not in md and "(s)" not in md
