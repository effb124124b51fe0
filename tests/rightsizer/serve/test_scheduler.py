"""serve: the YAML config's one-line errors, the jobs firing on a controlled clock through the real
APScheduler triggers (cron in an explicit zone, intervals, coalescing, misfires), the auto-apply
guard, the service's metrics, and /health, /metrics and SIGTERM on a running process."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from devkit.prometheus import free_port
from gpupilot_common.httpserve import Limits
from rightsizer.apply.applier import ApplyError
from rightsizer.cli import main
from rightsizer.commands.serve import http_server
from rightsizer.serve.config import ServeConfigError, load, parse
from rightsizer.serve.failures import quiet_job_failures
from rightsizer.serve.ledger import FileLedger, LedgerConflict
from rightsizer.serve.scheduler import Service
from rightsizer.serve.wording import in_config_terms
from tests.support.common.httpclients import get, oversized_header_status, slow_client_is_closed
from tests.support.rightsizer.serve_support import (
    BERLIN,
    FakeJobs,
    ManualScheduler,
    config,
    earlier_report,
    start,
    tick,
)

REPO = Path(__file__).resolve().parents[3]


def test_weekly_report_and_plans_fire_at_their_local_times(tmp_path, scheduler_clock):
    jobs = FakeJobs()
    cfg = config(tmp_path)
    earlier_report(cfg)  # not the first start: no start-up report
    service, sched = start(cfg, jobs, scheduler_clock)
    tick(sched, scheduler_clock, datetime(2026, 11, 30, 12, 0, tzinfo=BERLIN))
    reports = jobs.fired("report")
    assert [r[1] for r in reports] == [
        datetime(2026, 11, 30, 5, 0, tzinfo=UTC)
    ]  # Mon 06:00 Berlin = 05:00 UTC
    assert reports[0][2] == tmp_path / "state" / "reports" / "2026-11-30"
    plans = [p[1].astimezone(BERLIN).strftime("%a %H:%M") for p in jobs.fired("plan")]
    assert plans == [
        "Sat 20:00",
        "Sun 02:00",
        "Sun 08:00",
        "Sun 14:00",
        "Sun 20:00",
        "Mon 02:00",
        "Mon 08:00",
    ]
    reg = service.registry()
    assert reg.get_sample_value("gpupilot_rightsizer_last_plan_success") == 1.0
    assert reg.get_sample_value("gpupilot_rightsizer_freeable_gpus") == 3.0
    assert (
        reg.get_sample_value("gpupilot_rightsizer_last_plan_timestamp_seconds")
        == datetime(2026, 11, 30, 8, 0, tzinfo=BERLIN).timestamp()
    )
    sched.shutdown()


def test_missed_runs_are_coalesced_and_stale_reports_skipped(tmp_path, scheduler_clock):
    jobs = FakeJobs()
    cfg = config(tmp_path)
    earlier_report(cfg)  # not the first start: no start-up report
    _, sched = start(cfg, jobs, scheduler_clock)
    sched._process_jobs()  # the start-up plan
    scheduler_clock.now += timedelta(days=2, hours=1)  # asleep from Saturday 20:00 to Monday 21:00
    sched._process_jobs()
    assert len(jobs.fired("plan")) == 2  # 8 missed plans → one run, not a burst
    assert jobs.fired("report") == []  # Monday 06:00 is past its 6-hour grace: skipped, not run late
    tick(sched, scheduler_clock, datetime(2026, 12, 7, 6, 30, tzinfo=BERLIN), step=timedelta(hours=1))
    assert [r[1] for r in jobs.fired("report")] == [datetime(2026, 12, 7, 5, 0, tzinfo=UTC)]
    sched.shutdown()


def test_a_failed_plan_is_a_failure_retried_within_minutes(tmp_path, scheduler_clock, caplog):
    quiet_job_failures()
    jobs = FakeJobs(fail_plan=True)
    service, sched = start(config(tmp_path), jobs, scheduler_clock)
    caplog.set_level(logging.INFO)
    sched._process_jobs()
    reg = service.registry()
    assert reg.get_sample_value("gpupilot_rightsizer_last_plan_success") == 0.0
    assert reg.get_sample_value("gpupilot_rightsizer_job_failures_total", {"job": "plan"}) == 1.0
    assert reg.get_sample_value("gpupilot_rightsizer_freeable_gpus") is None
    # APScheduler saw it fail (its line, no traceback), never "executed successfully"
    aps = [r for r in caplog.records if r.name.startswith("apscheduler.executors")]
    assert not any("executed successfully" in r.getMessage() for r in aps)
    failed = [r for r in aps if "raised an exception" in r.getMessage()]
    assert failed and failed[0].exc_info is None and "prometheus down" in failed[0].getMessage()
    health = service.health(sched)
    assert health["status"] == "failing" and health["failing"]["plan"]["message"] == "prometheus down"
    # retried after 1, 2, 4 minutes (not 6 hours later), logged once as an error
    tick(sched, scheduler_clock, scheduler_clock.now + timedelta(minutes=8), step=timedelta(seconds=30))
    assert len(jobs.fired("plan")) == 4
    assert reg.get_sample_value("gpupilot_rightsizer_job_failures_total", {"job": "plan"}) == 4.0
    errors = [
        r for r in caplog.records if r.name == "rightsizer.serve.scheduler" and r.levelno == logging.ERROR
    ]
    assert len(errors) == 1
    jobs.fail_plan = False  # Prometheus is back: the next retry (8 minutes after the 4th) succeeds
    tick(sched, scheduler_clock, scheduler_clock.now + timedelta(minutes=9), step=timedelta(seconds=30))
    assert len(jobs.fired("plan")) == 5 and service.health(sched)["status"] == "ok"
    assert reg.get_sample_value("gpupilot_rightsizer_last_plan_success") == 1.0
    assert [j.id for j in sched.get_jobs()] == ["plan", "report"]
    sched.shutdown()


GUARD = {
    "enabled": True,
    "maintenance_window": {"days": ["sun"], "start": "01:00", "end": "05:00"},
    "max_nodes_per_day": 1,
    "min_gpus_freed": 1,
    "check_every": "30m",
}


def test_auto_apply_only_in_the_window_and_within_the_daily_budget(tmp_path, scheduler_clock):
    jobs = FakeJobs()
    service, sched = start(config(tmp_path, auto_apply=GUARD), jobs, scheduler_clock)
    tick(sched, scheduler_clock, datetime(2026, 11, 29, 12, 0, tzinfo=BERLIN))  # through Sunday morning
    applies = jobs.fired("apply")
    assert len(applies) == 1
    when, nodes = applies[0][1], applies[0][2]
    assert when.astimezone(BERLIN).strftime("%a %H:%M") == "Sun 01:00" and nodes == [
        "gpu-a"
    ]  # most GPUs first
    reg = service.registry()
    assert reg.get_sample_value("gpupilot_rightsizer_applies_total", {"result": "applied"}) == 1.0
    assert "max_nodes_per_day=1 reached" in service.state.last_skip or "outside" in service.state.last_skip
    ledger = json.loads((tmp_path / "state" / "auto-apply-ledger.json").read_text())
    assert ledger["2026-11-29"] == ["gpu-a"]
    # next Sunday: the other node (the plan was refreshed every 6 hours in between)
    tick(sched, scheduler_clock, datetime(2026, 12, 6, 2, 0, tzinfo=BERLIN), step=timedelta(hours=1))
    assert [c[2] for c in jobs.fired("apply")] == [["gpu-a"], ["gpu-b"]]
    sched.shutdown()


def test_a_configuration_error_is_said_once_backs_off_and_shows_on_health(tmp_path, scheduler_clock, caplog):
    caplog.set_level(logging.INFO)
    refusal = ApplyError(
        "ClusterPolicy cluster-policy points the MIG Manager at ConfigMap default-mig-parted-config; writing "
        "gpupilot-mig-parted-config needs the ClusterPolicy repointed, a cluster-wide change: pass "
        "--repoint-cluster-policy to allow it"
    )
    jobs = FakeJobs(apply_error=refusal)
    service, sched = start(config(tmp_path, auto_apply=GUARD), jobs, scheduler_clock)
    tick(
        sched, scheduler_clock, datetime(2026, 11, 29, 5, 0, tzinfo=BERLIN)
    )  # the whole window, checks every 30 min
    # tried at 01:00, then after 30 min, 1 h, 2 h: not at each of the 8 checks
    assert [c[1].astimezone(BERLIN).strftime("%H:%M") for c in jobs.fired("apply")] == [
        "01:00",
        "01:30",
        "02:30",
        "04:30",
    ]
    errors = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.ERROR and r.name.startswith("rightsizer")
    ]
    assert len(errors) == 1, errors
    assert "set auto_apply.repoint_cluster_policy: true in serve.yaml" in errors[0]
    assert "--repoint" not in errors[0]
    failing = service.health(sched)["failing"]["auto_apply"]
    assert failing["failures_in_a_row"] == 4 and "repoint_cluster_policy" in failing["message"]
    assert "backing off" in service.state.last_skip
    reg = service.registry()
    assert reg.get_sample_value("gpupilot_rightsizer_job_failures_total", {"job": "auto_apply"}) == 4.0
    ledger = json.loads((tmp_path / "state" / "auto-apply-ledger.json").read_text())
    assert not [k for k in ledger if k.startswith("started:")]  # nothing left handed over
    sched.shutdown()


class ConflictOnce(FileLedger):
    """A ledger someone else writes once between our read and our second write."""

    def __init__(self, path):
        super().__init__(path)
        self.saves = 0

    def save(self, entries):
        self.saves += 1
        if self.saves == 2:
            other = self.load()
            other.add_day("2026-11-28", {"elsewhere"})
            super().save(other)
            raise LedgerConflict("changed since it was read")
        super().save(entries)


def test_a_conflicting_ledger_write_after_the_apply_loses_nothing(tmp_path, scheduler_clock):
    jobs = FakeJobs()
    cfg = config(tmp_path, auto_apply=GUARD)
    jobs.clock = scheduler_clock
    ledger = ConflictOnce(tmp_path / "ledger.json")
    service = Service(cfg, jobs=jobs, clock=scheduler_clock, ledger=ledger)
    service.run_plan()
    scheduler_clock.now = datetime(2026, 11, 29, 2, 0, tzinfo=BERLIN)
    assert service.run_auto_apply()
    entries = json.loads((tmp_path / "ledger.json").read_text())
    assert entries["2026-11-29"] == ["gpu-a"] and entries["2026-11-28"] == ["elsewhere"]
    assert entries[f"plan:{jobs.plan.plan_id}"] == ["gpu-a"]
    assert not [k for k in entries if k.startswith("started:")]


@pytest.mark.parametrize(
    ("message", "said"),
    [
        (
            "cannot reach Prometheus at http://p:9090 (ConnectionError); is it running? check --prometheus-url",
            "cannot reach Prometheus at http://p:9090 (ConnectionError); is it running? check prometheus_url in s.yaml",
        ),
        (
            "ClusterPolicy cp says the GPU Operator runs in namespace nvidia-gpu-operator, not gpu-operator: "
            "pass --namespace nvidia-gpu-operator",
            "ClusterPolicy cp says the GPU Operator runs in namespace nvidia-gpu-operator, not gpu-operator: "
            "set auto_apply.operator_namespace: nvidia-gpu-operator in s.yaml",
        ),
        (
            "no gpupilot_gpu_info series at 2026-12-01T16:01:45Z in http://p:9090; is the exporter scraped? "
            "(use --at for history that ended earlier)",
            "no gpupilot_gpu_info series at 2026-12-01T16:01:45Z in http://p:9090; is the exporter scraped?",
        ),
        ("see --max-query-series", "see --max-query-series"),  # no serve field: left as it is
    ],
)
def test_messages_name_the_serve_config_fields(message, said):
    assert in_config_terms(message, "s.yaml") == said


def test_the_ledger_stays_bounded(tmp_path, scheduler_clock):
    jobs = FakeJobs()
    _, sched = start(config(tmp_path, auto_apply=GUARD), jobs, scheduler_clock)
    old = {"2026-09-01": ["gpu-x"], "2026-11-01": ["gpu-y"], "plan:0123456789abcdef": ["gpu-z"]}
    (tmp_path / "state").mkdir(parents=True, exist_ok=True)
    (tmp_path / "state" / "auto-apply-ledger.json").write_text(json.dumps(old))
    tick(sched, scheduler_clock, datetime(2026, 11, 29, 2, 0, tzinfo=BERLIN))
    entries = json.loads((tmp_path / "state" / "auto-apply-ledger.json").read_text())
    # 31 days kept; what older plans tried is dropped (only the current plan is ever applied)
    assert entries == {
        "2026-11-01": ["gpu-y"],
        "2026-11-29": ["gpu-a"],
        f"plan:{jobs.plan.plan_id}": ["gpu-a"],
    }
    sched.shutdown()


def test_auto_apply_skips_plans_below_min_gpus_freed(tmp_path, scheduler_clock):
    jobs = FakeJobs()
    guard = {**GUARD, "min_gpus_freed": 5}
    service, sched = start(config(tmp_path, auto_apply=guard), jobs, scheduler_clock)
    tick(sched, scheduler_clock, datetime(2026, 11, 29, 3, 0, tzinfo=BERLIN))
    assert jobs.fired("apply") == []
    assert "below min_gpus_freed=5" in service.state.last_skip
    sched.shutdown()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"timezone": None}, "serve.yaml: timezone: required"),
        ({"timezone": "Mars/Olympus"}, "'Mars/Olympus' is not an IANA time zone"),
        ({"timezone": "E" * 300}, "timezone: 'EEEEEEEEEE"),
        ({"auto_apply": {"configmap_sync": "2h"}}, "auto_apply.configmap_sync: must be between 0s and 3600s"),
        ({"auto_apply": {"lease_duration": "2h"}}, "auto_apply.lease_duration: must be between 1s and 3600s"),
        ({"auto_apply": {"repoint_cluster_policy": "yes please"}}, "auto_apply.repoint_cluster_policy:"),
        ({"report": {"schedule": "monday at six"}}, "report.schedule: 'monday at six' is not a schedule"),
        ({"plan": {"every": "soon"}}, "plan.every: 'soon' is not a duration"),
        ({"plan": {"evry": "6h"}}, "plan.evry: unknown field"),
        ({"plan": {"headroom": -1}}, "plan.headroom: must be a number from 0 to 4"),
        ({"plan": {"idle_threshold": "low"}}, "plan.idle_threshold: must be a number from 0 to 1"),
        ({"plan": {"min_busy": "1m"}}, "plan.min_busy: must be between 5m and 6h"),
        (
            {"auto_apply": {"enabled": True}},
            "auto_apply.maintenance_window: required when auto_apply.enabled",
        ),
        ({"prometheus_url": "prometheus:9090"}, "must start with http://"),
        ({"report": None, "plan": None}, "configure at least one job"),
        (
            {"auto_apply": {"operator_namespace": "GPU_Operator"}},
            "auto_apply.operator_namespace: must be a Kubernetes name",
        ),
    ],
)
def test_config_errors_are_one_line(tmp_path, change, message):
    doc = {
        "prometheus_url": "http://p:9090",
        "timezone": "UTC",
        "report": {"schedule": "mon 06:00"},
        "plan": {"every": "6h"},
    }
    doc.update(change)
    doc = {k: v for k, v in doc.items() if v is not None}
    with pytest.raises(ServeConfigError) as err:
        parse(doc, source="serve.yaml")
    assert message in str(err.value) and "\n" not in str(err.value)


def test_config_file_errors_name_the_line(tmp_path):
    path = tmp_path / "serve.yaml"
    path.write_text("prometheus_url: http://p:9090\ntimezone: UTC\nplan:\n  every: 6h\n  max_nodes: 0\n")
    with pytest.raises(ServeConfigError) as err:
        load(path)
    assert str(err.value) == f"{path}:5: plan.max_nodes: must be a whole number >= 1, got 0"


def test_operator_namespace_and_configmap_are_settings():
    doc = {"prometheus_url": "http://p:9090", "timezone": "UTC", "plan": {"every": "6h"}}
    assert (
        parse(doc, source="s").auto_apply.operator_namespace,
        parse(doc, source="s").auto_apply.mig_configmap,
    ) == (
        "gpu-operator",
        None,
    )
    doc["auto_apply"] = {"operator_namespace": "nvidia-gpu-operator", "mig_configmap": "my-mig"}
    auto = parse(doc, source="s").auto_apply
    assert (auto.operator_namespace, auto.mig_configmap) == ("nvidia-gpu-operator", "my-mig")


def test_the_apply_waits_and_the_repoint_are_serve_settings():
    from rightsizer.commands.serve import apply_settings  # noqa: PLC0415

    doc = {"prometheus_url": "http://p:9090", "timezone": "UTC", "plan": {"every": "6h"}}
    default = apply_settings(parse(doc, source="s").auto_apply)
    assert (default.configmap_sync_s, default.lease_duration_s, default.repoint_cluster_policy) == (
        60,
        60,
        False,
    )
    doc["auto_apply"] = {"configmap_sync": "0s", "lease_duration": "5s", "repoint_cluster_policy": True}
    tuned = apply_settings(parse(doc, source="s").auto_apply)
    assert (tuned.configmap_sync_s, tuned.lease_duration_s, tuned.repoint_cluster_policy) == (0, 5, True)


def test_plan_settings_reach_the_pipeline(tmp_path):
    cfg = config(tmp_path, plan={"every": "6h", "window": "2d", "headroom": 0.5, "min_busy": "30m"})
    assert cfg.plan is not None
    settings = cfg.plan.plan_settings()
    assert (settings.window_s, settings.headroom, settings.min_busy_s) == (2 * 86400, 0.5, 1800)
    assert settings.idle_threshold == 0.05 and settings.window_text == "2d"
    # the report job plans with the same settings over its own window
    assert cfg.plan.plan_settings(window_s=7 * 86400).record()["headroom"] == 0.5


def test_the_shipped_example_is_valid():
    cfg = load(REPO / "examples" / "rightsizer-serve.yaml")
    assert cfg.timezone.key == "Europe/Berlin" and cfg.report is not None and not cfg.auto_apply.enabled


@pytest.mark.slow
def test_serve_process_answers_health_and_metrics_and_stops_on_sigterm(tmp_path):
    port = free_port()
    cfg = tmp_path / "serve.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "prometheus_url": f"http://127.0.0.1:{free_port()}",  # nothing there: the plan job fails, visibly
                "timezone": "UTC",
                "listen": f"127.0.0.1:{port}",
                "state_dir": str(tmp_path / "state"),
                "plan": {"every": "1h"},
            }
        )
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "rightsizer", "serve", "--config", str(cfg)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        metrics = ""
        while time.monotonic() < deadline:
            try:
                metrics = (
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
                )
                if "gpupilot_rightsizer_last_plan_success 0.0" in metrics:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        assert "gpupilot_rightsizer_last_plan_success 0.0" in metrics
        assert 'gpupilot_rightsizer_applies_total{result="applied"} 0.0' in metrics
        health = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).read())
        assert health["status"] == "failing" and sorted(j["id"] for j in health["jobs"]) == [
            "plan",
            "plan-retry-1",
        ]
        assert f"check prometheus_url in {cfg}" in health["failing"]["plan"]["message"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        assert proc.stdout is not None
        assert b"received SIGTERM" in proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_http_endpoints_close_slow_and_refuse_oversized_clients(tmp_path, scheduler_clock):
    service, sched = start(config(tmp_path), FakeJobs(), scheduler_clock)
    limits = Limits(idle_timeout=0.5, max_header_bytes=2048)
    server = http_server(service, sched, "127.0.0.1", 0, limits=limits).start()
    try:
        assert slow_client_is_closed(server.port, within=0.5) < 3
        assert oversized_header_status(server.port, size=64 * 1024) == 431
        status, body = get(server.port, "/health")
        assert status == 200 and json.loads(body)["status"] == "ok"
        status, body = get(server.port, "/metrics")
        assert status == 200 and b"gpupilot_rightsizer_job_runs_total" in body
        assert get(server.port, "/nope")[0] == 404
    finally:
        server.close()
        sched.shutdown(wait=False)


def test_bad_config_file_exits_2_with_one_line(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("timezone: [unclosed\n")
    assert main(["serve", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}") and len(err.strip().splitlines()) == 1


def test_a_damaged_ledger_is_set_aside_not_overwritten(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "ledger.json"
    path.write_text('{"2026-11-30": ["gpu-a"], "plan:p1": ["gpu-a"')  # cut short: not valid JSON
    ledger = FileLedger(path)
    entries = ledger.load()
    assert entries.days == {} and "is not valid" in caplog.text and "ledger.json.damaged" in caplog.text
    entries.days["2026-12-01"] = ["gpu-b"]
    ledger.save(entries)
    assert (tmp_path / "ledger.json.damaged").read_text().startswith('{"2026-11-30": ["gpu-a"]')
    assert FileLedger(path).load().days == {"2026-12-01": ["gpu-b"]}


def test_a_node_a_dead_run_finished_is_recorded_when_its_hand_over_is_cleared():
    """A replica killed between two nodes never reported the first: the run that clears its hand-over
    records that node as disrupted on the day the cluster shows and tried by the dead run's plan, so the
    ledger agrees with the cluster; a handed-over node never cordoned is only cleared."""
    from rightsizer.serve.ledger import Entries  # noqa: PLC0415

    entries = Entries(started={"plan-a": ["gpu-1", "gpu-2", "gpu-3"]})
    cleared = entries.clear_settled({"gpu-2"}, disrupted={"gpu-1", "gpu-2"}, day="2026-12-07")
    assert cleared == {"gpu-1", "gpu-3"}
    assert entries.started == {"plan-a": ["gpu-2"]}  # still in flight: the next apply settles it
    assert entries.day("2026-12-07") == {"gpu-1"}
    assert entries.tried_in("plan-a") == {"gpu-1"}  # gpu-3 was never started: a later round may


@pytest.mark.slow
def test_health_turns_not_ok_while_a_job_is_stuck_past_its_deadline(tmp_path, scheduler_clock):
    """A plan run that does not end (a hang nobody foresaw) turns /health into 503 "stuck" once it
    passes its deadline, naming the job; when the run ends, /health is ok again."""
    import threading  # noqa: PLC0415

    release = threading.Event()
    entered = threading.Event()

    class HangingJobs(FakeJobs):
        def make_plan(self, *, end, job):
            entered.set()
            release.wait(30)
            return super().make_plan(end=end, job=job)

    jobs = HangingJobs()
    jobs.clock = scheduler_clock
    service = Service(config(tmp_path), jobs=jobs, clock=scheduler_clock, job_deadlines={"plan": 0.3})
    sched = ManualScheduler(timezone=service.config.timezone)
    server = http_server(service, sched, "127.0.0.1", 0).start()
    runner = threading.Thread(target=service._scheduled("plan", service.run_plan), daemon=True)
    try:
        runner.start()
        assert entered.wait(5)
        assert get(server.port, "/health")[0] == 200  # running, within its deadline
        time.sleep(0.5)
        status, body = get(server.port, "/health")
        health = json.loads(body)
        assert status == 503 and health["status"] == "stuck", health
        assert health["stuck"]["plan"]["deadline_s"] == 0.3 and health["stuck"]["plan"]["running_s"] >= 0.3
        release.set()
        runner.join(10)
        status, body = get(server.port, "/health")
        assert status == 200 and json.loads(body)["status"] == "ok"
    finally:
        release.set()
        server.close()
