"""The weekly report from a week of backfilled history: charts are real pictures, the plan's numbers
appear in the HTML and Markdown, alerts from ALERTS are listed; plus its command-line errors."""

from __future__ import annotations

import io
import re
import time

import pytest
from PIL import Image

from rightsizer.cli import main
from rightsizer.clients.prometheus import PrometheusClient
from rightsizer.plan.model import load_plan
from rightsizer.plan.pipeline import PlanSettings
from rightsizer.report import data as data_api
from rightsizer.report.build import build_report, generate, write_report
from rightsizer.serve.scheduler import idle_slices
from tests.support.rightsizer.report_support import plan_with_evidence, report_data

PRICE = 2.5


def pixel_spread(png: bytes) -> float:
    """Standard deviation of the grey levels: ~0 for a blank image."""
    hist = Image.open(io.BytesIO(png)).convert("L").histogram()
    n = sum(hist)
    mean = sum(i * c for i, c in enumerate(hist)) / n
    return (sum(c * (i - mean) ** 2 for i, c in enumerate(hist)) / n) ** 0.5


@pytest.fixture(scope="module")
def weekly(metrics_history, tmp_path_factory):
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
def test_charts_are_non_empty_pictures(weekly):
    written, _ = weekly
    names = {p.name for p in written.images}
    assert {"trend.png", "heatmap.png", "top-idle.png"} <= names
    for path in written.images:
        png = path.read_bytes()
        assert len(png) > 8000, path
        assert pixel_spread(png) > 10, path


@pytest.mark.prometheus
def test_plan_numbers_appear_in_html_and_markdown(weekly):
    written, plan = weekly
    html = written.html.read_text()
    md = written.markdown.read_text()
    assert plan.plan_id in html and plan.plan_id in md
    freed = plan.totals.gpus_freed
    hours = freed * 168
    for text in (html, md):
        assert (
            f"free {freed} GPU(s): {hours:,.0f} GPU-hours a week" in text
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
def test_alerts_from_the_alerts_series_are_listed(metrics_history, tmp_path):
    """ALERTS is whatever Prometheus evaluated; the report lists each alert that fired, or says none did."""
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


def test_synthetic_week_renders_every_section_with_the_plan_numbers(tmp_path):
    data = report_data(price=2.5)
    written = write_report(build_report(data), tmp_path)
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
        assert "free 3 GPU(s): 504 GPU-hours a week, worth 1,260 a week and 65,520 a year" in text
        assert "MIGSliceIdle24h" in text and "GPUXidError" in text and "86.7 h" in text
        changes = text.split("Proposed layout changes")[1].split("Top idle slices")[0]
        assert "gpu-node-1" in changes and "gpu-node-3" not in changes
    assert "| gpu-node-1 | H100 80GB |" in md and "| 2 | 336 | 840 |" in md
    assert "ml/infer-0-0" in html and ">168<" in html


def test_without_price_or_alerts_the_report_says_so(tmp_path):
    written = write_report(build_report(report_data(price=None, alerts=False)), tmp_path)
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
    assert "free 3 GPU(s): 504 GPU-hours a week, worth 1,260 a week" in html
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


def test_top_idle_slices_leave_out_a_slice_that_bursts():
    """Same rule as serve's gpupilot_rightsizer_idle_slices: GPU 1 has many idle hours but a burst."""
    report = build_report(report_data())
    labels = [s.label for s in report.idle]
    assert labels and not any("GPU 1 " in label for label in labels)
    assert {s.node for s in report.idle} == {"gpu-node-1", "gpu-node-2"}
    assert len(labels) == 6 == idle_slices(report.data.plan)  # GPUs 0, 2, 3 on both nodes


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
