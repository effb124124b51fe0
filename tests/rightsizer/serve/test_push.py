"""serve's report push: a Slack-compatible message (or the figures as JSON) POSTed to the URL a
mounted Secret holds, a copy of the report folder to an archive path; failures tried three times,
counted, logged without the URL, the report kept; the config's one-line errors."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from rightsizer.serve.config import ServeConfigError
from rightsizer.serve.push import ReportPush, push
from tests.support.rightsizer.serve_support import FakeJobs, config, start, tick

SECRET_PATH = "/services/T000/B000/this-is-the-secret"


class Hook(http.server.BaseHTTPRequestHandler):
    received: ClassVar[list[dict[str, object]]] = []
    status: ClassVar[int] = 200

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        Hook.received.append({"path": self.path, "body": json.loads(self.rfile.read(length))})
        self.send_response(Hook.status)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *_args: object) -> None:
        return


@pytest.fixture
def hook(tmp_path: Path) -> Iterator[Path]:
    """A webhook on loopback; the file holding its URL (as the chart mounts the Secret)."""
    Hook.received, Hook.status = [], 200
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url_file = tmp_path / "url"
    url_file.write_text(f"http://127.0.0.1:{server.server_address[1]}{SECRET_PATH}\n")
    yield url_file
    server.shutdown()
    server.server_close()


def report_folder(base: Path) -> Path:
    folder = base / "reports" / "2026-11-30"
    folder.mkdir(parents=True)
    (folder / "report.html").write_text("<p>r</p>")
    (folder / "figures.json").write_text('{"idle_allocated": 6, "gpus_freed": 3}')
    return folder


FIGURES = {
    "idle_allocated": 6,
    "unallocated": 11,
    "gpus_freed": 3,
    "gpu_hours_per_week": 504.0,
    "cost_per_week": 1260.0,
}


def test_a_slack_message_and_a_copy(tmp_path: Path, hook: Path) -> None:
    folder = report_folder(tmp_path)
    counted: list[tuple[str, str]] = []
    settings = ReportPush(
        webhook_url_file=hook, link="https://gpu.example/report/", copy_to=tmp_path / "archive"
    )
    push(folder, FIGURES, settings, record=lambda t, r: counted.append((t, r)), sleep=lambda _s: None)
    ((got),) = Hook.received
    assert got["path"] == SECRET_PATH
    text = got["body"]["text"]  # type: ignore[index]
    assert text.startswith("GPU rightsizing report 2026-11-30: 6 allocated device(s) idle all window")
    assert "1,260 saved per week" in text and text.endswith(
        "https://gpu.example/report/2026-11-30/report.html"
    )
    assert (tmp_path / "archive" / "2026-11-30" / "report.html").read_text() == "<p>r</p>"
    assert counted == [("webhook", "ok"), ("copy", "ok")]


def test_json_format_sends_the_figures(tmp_path: Path, hook: Path) -> None:
    push(
        report_folder(tmp_path),
        FIGURES,
        ReportPush(webhook_url_file=hook, format="json"),
        record=lambda *_: None,
    )
    assert Hook.received[0]["body"] == {"report": "2026-11-30", "link": "", "figures": FIGURES}


def test_a_failing_webhook_is_tried_three_times_counted_and_never_names_the_url(
    tmp_path: Path, hook: Path, caplog: pytest.LogCaptureFixture
) -> None:
    Hook.status = 500
    folder = report_folder(tmp_path)
    counted: list[tuple[str, str]] = []
    pauses: list[float] = []
    push(
        folder,
        FIGURES,
        ReportPush(webhook_url_file=hook),
        record=lambda t, r: counted.append((t, r)),
        sleep=pauses.append,
    )
    assert len(Hook.received) == 3 and pauses == [10.0, 45.0]
    assert counted == [("webhook", "failed")]
    assert "HTTP 500" in caplog.text and "the report is kept" in caplog.text
    assert SECRET_PATH not in caplog.text and "this-is-the-secret" not in caplog.text
    assert (folder / "report.html").is_file()


def test_the_weekly_report_pushes_and_counts(tmp_path: Path, hook: Path, scheduler_clock) -> None:
    from datetime import UTC, datetime  # noqa: PLC0415

    cfg = config(tmp_path, report={"schedule": "mon 06:00", "push": {"webhook_url_file": str(hook)}})
    service, sched = start(cfg, FakeJobs(), scheduler_clock)
    service.sleep = lambda _s: None
    tick(sched, scheduler_clock, datetime(2026, 11, 30, 11, 0, tzinfo=UTC))
    assert Hook.received, "no push"
    reg = service.registry()
    assert (
        reg.get_sample_value("gpupilot_rightsizer_report_pushes_total", {"target": "webhook", "result": "ok"})
        >= 1
    )
    sched.shutdown()


@pytest.mark.parametrize(
    ("push_config", "message"),
    [
        ({"webhook_url_file": "/nonexistent/url"}, "mount the Secret holding the URL"),
        ({"copy_to": "relative/dir"}, "an absolute path"),
        ({"format": "xml", "copy_to": "/tmp"}, "one of slack, json"),
        ({"link": "gpu.example", "copy_to": "/tmp"}, "not an http(s) URL"),
        ({}, "needs webhook_url_file and/or copy_to"),
    ],
)
def test_bad_push_config_is_one_line(tmp_path: Path, push_config: dict[str, str], message: str) -> None:
    with pytest.raises(ServeConfigError) as err:
        config(tmp_path, report={"schedule": "mon 06:00", "push": push_config})
    assert message in str(err.value) and "\n" not in str(err.value)
