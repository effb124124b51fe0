"""Sections 2–4: what the HPA would do, the rightsizing plan and report, and where everything is."""

from __future__ import annotations

import json
import urllib.parse
from pathlib import Path

from devkit import prometheus
from devkit.demo import commands
from devkit.demo.console import Console, StepFailed
from devkit.demo.services import Endpoints
from devkit.demo.settings import DemoSettings

HPA_FILE = "examples/hpa-llm-inference.yaml"
HPA_NAMESPACE = "ai-serving"
HPA_SELECTOR = "app=llm-inference"
RAW_METRIC = "DCGM_FI_DEV_GPU_UTIL"
EXAMPLE_PRICE = 2.50
"""An example GPU-hour price for the report's cost lines (set your own with --price-per-gpu-hour)."""


def window(settings: DemoSettings) -> str:
    """The rightsizer's window: a week, or the whole history when less was backfilled."""
    return "7d" if settings.days >= 7 else f"{max(1, int(settings.days * 24))}h"


def _indent(con: Console, text: str, *, limit: int = 60) -> None:
    lines = text.rstrip().splitlines()
    for line in lines[:limit]:
        con.line(f"  {line}")
    if len(lines) > limit:
        con.line(f"  … {len(lines) - limit} more lines")


def explain_hpa(con: Console, settings: DemoSettings, ends: Endpoints) -> None:
    hpa = settings.root / HPA_FILE
    if not hpa.exists():
        raise StepFailed(f"{HPA_FILE} is missing: it holds the example llm-inference HPA")
    if not ends.prometheus:
        raise StepFailed("Prometheus is not running")
    args = ["explain-hpa", "-f", str(hpa), "--prometheus-url", ends.prometheus, "--pod-source", "prometheus"]
    res = commands.run("gpupilot-adapter", args, root=settings.root, timeout=60)
    con.line(f"$ {res.shown}")
    _indent(con, res.stdout)


def replay_hpa(con: Console, settings: DemoSettings, ends: Endpoints) -> Path:
    """The example HPA replayed over the backfilled history, as written and with a lower GPU target."""
    hpa = settings.root / HPA_FILE
    if not ends.prometheus:
        raise StepFailed("Prometheus is not running")
    chart = settings.work / "replay-hpa.png"
    args = [
        "replay-hpa",
        "-f",
        str(hpa),
        "--prometheus-url",
        ends.prometheus,
        "--since",
        window(settings),
        "--step",
        "15s",
        "--set",
        f"{RAW_METRIC}=60",
        "--chart",
        str(chart),
        "--rows",
        "14",
    ]
    res = commands.run("gpupilot-adapter", args, root=settings.root, timeout=300)
    con.line(f"$ {res.shown}")
    _indent(con, res.stdout)
    if not chart.exists():
        raise StepFailed(f"replay-hpa wrote no chart at {chart}")
    return chart


RECOMMEND_HPA_FILE = "examples/hpa-chat-inference.yaml"
RECOMMEND_BOUND = 'inference_queue_wait_seconds{quantile="0.95"} <= 2'
RECOMMEND_BUDGET = "2%"


def recommend_window(settings: DemoSettings) -> tuple[str, str] | None:
    """(--since, --held-out) for the history the demo has: a week with two days held out, or the
    whole days available with one held out; None below three days."""
    days = int(settings.days)
    if days >= 7:
        return "7d", "2d"
    if days >= 3:
        return f"{days}d", "1d"
    return None


def recommend_hpa(con: Console, settings: DemoSettings, ends: Endpoints) -> None:
    """recommend-hpa on the demo's autoscaled inference service (chat-inference)."""
    if not ends.prometheus:
        raise StepFailed("Prometheus is not running")
    window = recommend_window(settings)
    if window is None:
        con.line(
            f"  recommend-hpa learns from at least 3 days (the demo has {settings.days:g}; DEMO_DAYS=7 shows it)"
        )
        return
    since, held = window
    # the backfilled days end minutes before live scraping starts: recommend on those days
    until = ends.history_end - ends.history_end % 15 if ends.history_end else 0.0
    args = [
        "recommend-hpa",
        "-f",
        str(settings.root / RECOMMEND_HPA_FILE),
        "--prometheus-url",
        ends.prometheus,
        "--bound",
        RECOMMEND_BOUND,
        "--bound-budget",
        RECOMMEND_BUDGET,
        "--since",
        since,
        "--held-out",
        held,
        *(["--until", f"{until:.0f}"] if until else []),
    ]
    # exit 1 (nothing meets the bound) is an answer too, said on stderr
    res = commands.run("gpupilot-adapter", args, root=settings.root, timeout=600, ok_codes=(0, 1))
    con.line(f"$ {res.shown}")
    _indent(con, res.stdout, limit=80)
    if res.code == 1:
        con.line(f"  {res.stderr.strip().splitlines()[-1]}")


def raw_custom_metrics(con: Console, ends: Endpoints, kubeconfig: Path) -> None:
    if not ends.adapter:
        raise StepFailed("the adapter is not running (see the set-up steps above)")
    discovery = commands.kubectl(
        ["get", "--raw", "/apis/custom.metrics.k8s.io/v1beta2"], kubeconfig=kubeconfig
    )
    resources = json.loads(discovery.stdout).get("resources", [])
    con.line(f"$ {discovery.shown}")
    names = sorted({r["name"] for r in resources})
    con.line(
        f"  {len(names)} metrics served, e.g. " + ", ".join(names[:6]) + (" …" if len(names) > 6 else "")
    )
    con.line("")
    path = (
        f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{HPA_NAMESPACE}/pods/*/{RAW_METRIC}"
        f"?labelSelector={urllib.parse.quote(HPA_SELECTOR)}"
    )
    answer = commands.kubectl(["get", "--raw", path], kubeconfig=kubeconfig)
    con.line(f"$ {answer.shown}")
    body = json.loads(answer.stdout)
    items = body.get("items", [])
    if not items:
        raise StepFailed(f"the adapter answered with no items for {RAW_METRIC} of {HPA_SELECTOR}")
    shown = dict(body, items=items[:2])
    _indent(con, json.dumps(shown, indent=2))
    if len(items) > 2:
        con.line(f"  … and {len(items) - 2} more items")
    values = ", ".join(f"{i['describedObject']['name']}={i['value']}" for i in items)
    con.line(f"  values: {values}")


def plan(con: Console, settings: DemoSettings, ends: Endpoints) -> Path:
    if not ends.prometheus:
        raise StepFailed("Prometheus is not running")
    out = settings.work / "plan.json"
    out.unlink(missing_ok=True)
    args = ["plan", "--prometheus-url", ends.prometheus, "--window", window(settings), "--out", str(out)]
    res = commands.run("gpupilot-rightsizer", args, root=settings.root, timeout=180)
    con.line(f"$ {res.shown}")
    _indent(con, res.stdout, limit=80)
    if not out.exists():
        raise StepFailed(f"'{res.shown}' wrote no {out}")
    return out


def report(con: Console, settings: DemoSettings, ends: Endpoints) -> Path:
    if not ends.prometheus:
        raise StepFailed("Prometheus is not running")
    out = settings.work / "report"
    args = ["report", "--prometheus-url", ends.prometheus, "--out", str(out), "--window", window(settings)]
    plan_file = settings.work / "plan.json"
    if plan_file.exists():
        args += ["--plan", str(plan_file)]
    args += ["--price-per-gpu-hour", f"{EXAMPLE_PRICE:.2f}"]
    res = commands.run("gpupilot-rightsizer", args, root=settings.root, timeout=240)
    con.line(f"$ {res.shown}")
    _indent(con, res.stdout, limit=20)
    pages = sorted(out.glob("*.html"))
    if not pages:
        raise StepFailed(f"'{res.shown}' wrote no HTML report under {out}")
    charts = sorted(out.rglob("*.png"))
    con.line(
        f"  weekly report: {pages[0]}  ({len(charts)} charts; Markdown: {', '.join(p.name for p in out.glob('*.md'))})"
    )
    return pages[0]


def urls(
    con: Console, settings: DemoSettings, ends: Endpoints, kubeconfig: Path, *, exit_when_done: bool
) -> None:
    if ends.prometheus and settings.backend == "victoriametrics":
        con.line(f"  VictoriaMetrics UI    {ends.prometheus}/vmui  (try gpupilot:slice_activity:avg5m)")
        if ends.rules:
            con.line(f"  vmalert alerts        {ends.rules}/api/v1/alerts")
    elif ends.prometheus and prometheus.engine().has_web_ui:
        con.line(f"  Prometheus UI         {ends.prometheus}/graph  (try gpupilot:slice_activity:avg5m)")
        con.line(f"  Prometheus alerts     {ends.prometheus}/alerts")
    elif ends.prometheus:  # a Prometheus built from its Go module: the API only
        query = urllib.parse.urlencode({"query": "gpupilot:slice_activity:avg5m"})
        con.line(f"  Prometheus API        {ends.prometheus}/api/v1/query?{query}")
        con.line(f"  Prometheus alerts     {ends.prometheus}/api/v1/alerts")
        con.line(
            f"  (Prometheus {prometheus.engine().release} is built without its web UI; GPUPILOT_PROMETHEUS=2.42 has one)"
        )
    for node, url in ends.exporters.items():
        con.line(f"  exporter {node:<12} {url}/metrics")
    if ends.cluster:
        con.line(f"  cluster series        {ends.cluster}/metrics  (kube-state-metrics names)")
    if ends.adapter:
        con.line(f"  adapter               {ends.adapter}/apis/custom.metrics.k8s.io/v1beta2")
        con.line(
            f"  kubectl               kubectl --kubeconfig {kubeconfig} get --raw /apis/custom.metrics.k8s.io/v1beta2"
        )
    con.line(f"  logs                  {settings.logs}/")
    con.line("")
    if exit_when_done:
        con.line("DEMO_EXIT is set: stopping everything now.")
    else:
        con.line("Running until Ctrl-C (every process started here is stopped then).")
