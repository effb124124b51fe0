"""``serve``'s /report/, /reports/ and /plan.json over a real HTTP server (gpupilot_common.httpserve):
the newest dated report, its files with their content types, and nothing outside the report
folders (traversal, hidden files, symbolic links, oversized files all refused)."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path, PosixPath

import pytest

from gpupilot_common.httpserve import FileReply, Reply
from rightsizer.commands.serve import http_server
from rightsizer.serve.webfiles import ReportFiles
from tests.support.rightsizer.serve_support import FakeJobs, config, start

PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 64


def fetch(port: int, path: str) -> tuple[int, dict[str, str], bytes]:
    """One raw GET (the path goes out exactly as given, unnormalised)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    return int(lines[0].split(" ", 2)[1]), headers, body


@pytest.fixture
def served_reports(tmp_path, scheduler_clock):
    cfg = config(tmp_path)
    reports = cfg.state_dir / "reports"
    for day, title in (("2026-11-23", "older"), ("2026-11-30", "newest")):
        (reports / day).mkdir(parents=True)
        (reports / day / "report.html").write_text(f"<h1>{title}</h1><img src='waste.png'>")
        (reports / day / "waste.png").write_bytes(PNG)
        (reports / day / "report.md").write_text(f"# {title}\n")
    (reports / "2026-12-07").mkdir()  # a report being written: no report.html yet
    secret = tmp_path / "secret.txt"
    secret.write_text("not for the web")
    (reports / "2026-11-30" / "link.html").symlink_to(secret)
    (reports / "2026-11-30" / ".hidden").write_text("hidden")
    (cfg.state_dir / "plan.json").write_text(json.dumps({"plan_id": "p-1"}))
    service, sched = start(cfg, FakeJobs(), scheduler_clock)
    server = http_server(service, sched, "127.0.0.1", 0).start()
    yield server.port, cfg
    server.close()
    sched.shutdown(wait=False)


def test_latest_report_its_files_and_the_plan(served_reports):
    port, _ = served_reports
    status, headers, body = fetch(port, "/report/")
    assert (status, headers["content-type"]) == (200, "text/html; charset=utf-8")
    assert b"newest" in body
    status, headers, body = fetch(port, "/report/waste.png")
    assert (status, headers["content-type"], body) == (200, "image/png", PNG)
    assert fetch(port, "/report/report.md")[1]["content-type"] == "text/markdown; charset=utf-8"
    status, headers, body = fetch(port, "/plan.json")
    assert (status, headers["content-type"], json.loads(body)) == (
        200,
        "application/json",
        {"plan_id": "p-1"},
    )
    status, _, body = fetch(port, "/reports/")
    assert status == 200 and body.index(b"2026-11-30") < body.index(b"2026-11-23")
    assert b"2026-12-07" not in body, "a folder without report.html is not a report"
    status, _, body = fetch(port, "/reports/2026-11-23/")
    assert status == 200 and b"older" in body
    assert fetch(port, "/report")[0] == 200  # a link to /report/, where relative links work


@pytest.mark.parametrize(
    "path",
    [
        "/report/../../secret.txt",
        "/report/..%2f..%2fsecret.txt",
        "/report/%2e%2e/%2e%2e/secret.txt",
        "/reports/2026-11-30/../../../secret.txt",
        "/reports/..%2F..%2Fsecret.txt",
        "/report/link.html",  # a symbolic link out of the folder
        "/report/.hidden",
        "/report/sub/report.html",
        "/reports/2026-12-07/",  # no report there yet
        "/reports/latest/",
        "/report/%00report.html",
    ],
)
def test_nothing_outside_the_report_folders(served_reports, path):
    port, _ = served_reports
    status, _, body = fetch(port, path)
    assert status in (400, 404), (path, status)
    assert b"not for the web" not in body and body.strip() != b"hidden"


def test_missing_report_and_plan_say_so(tmp_path, scheduler_clock):
    cfg = config(tmp_path)
    service, sched = start(cfg, FakeJobs(), scheduler_clock)
    server = http_server(service, sched, "127.0.0.1", 0).start()
    try:
        status, _, body = fetch(server.port, "/report/")
        assert status == 404 and b"no report yet" in body
        status, _, body = fetch(server.port, "/plan.json")
        assert status == 404 and b"no plan yet" in body
    finally:
        server.close()
        sched.shutdown(wait=False)


def test_oversized_files_are_refused_unread(tmp_path: Path):
    day = tmp_path / "reports" / "2026-11-30"
    day.mkdir(parents=True)
    (day / "report.html").write_bytes(b"x" * 2048)
    files = ReportFiles(reports_dir=tmp_path / "reports", plan_path=tmp_path / "plan.json", max_bytes=1024)
    reply = files.answer("/report/")
    assert isinstance(reply, Reply), "refused before any file is opened"
    assert reply.status == 500 and b"larger than 1024 bytes" in reply.body
    (day / "report.html").write_bytes(b"x" * 1024)
    assert files.answer("/report/").status == 200


def test_a_file_swapped_for_a_link_after_a_check_is_not_followed(tmp_path: Path):
    """The file is opened without following links and checked on what was opened: a plan.json
    replaced by a symbolic link between a check of the path and its opening is never read."""
    secret = tmp_path / "secret.txt"
    secret.write_text("not for the web")

    class SwappedOnCheck(PosixPath):
        def lstat(self):
            info = super().lstat()
            self.unlink()
            self.symlink_to(secret)
            return info

    plan = SwappedOnCheck(tmp_path / "plan.json")
    plan.write_text('{"plan_id": "p-1"}')
    reply = ReportFiles(reports_dir=tmp_path / "reports", plan_path=plan).answer("/plan.json")
    assert isinstance(reply, FileReply)
    with reply.file:
        body = reply.file.read()
    assert reply.status == 200 and b"p-1" in body and b"not for the web" not in body


def test_a_date_folder_swapped_for_a_link_after_the_check_is_not_followed(tmp_path: Path):
    """The folder is checked (listed as a report) and then, before the open, replaced by a symbolic
    link to a folder outside: every component is opened without following links."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "report.html").write_text("not for the web")
    reports = tmp_path / "reports"
    (reports / "2026-11-30").mkdir(parents=True)
    (reports / "2026-11-30" / "report.html").write_text("<h1>ours</h1>")

    class SwappedAfterCheck(ReportFiles):
        def dated(self) -> list[Path]:
            found = super().dated()
            day = reports / "2026-11-30"
            if day.is_dir() and not day.is_symlink():
                (day / "report.html").unlink()
                day.rmdir()
                day.symlink_to(outside)
            return found

    for path in ("/reports/2026-11-30/", "/report/"):
        files = SwappedAfterCheck(reports_dir=reports, plan_path=tmp_path / "plan.json")
        reply = files.answer(path)
        assert isinstance(reply, Reply) and reply.status == 404, path
        assert b"not for the web" not in reply.body
        (reports / "2026-11-30").unlink()
        (reports / "2026-11-30").mkdir()
        (reports / "2026-11-30" / "report.html").write_text("<h1>ours</h1>")


def test_a_hard_link_is_refused(served_reports, tmp_path: Path):
    port, cfg = served_reports
    secret = tmp_path / "secret.txt"
    os.link(secret, cfg.state_dir / "reports" / "2026-11-30" / "notes.txt")
    status, _, body = fetch(port, "/report/notes.txt")
    assert status == 404 and b"hard link" in body and b"not for the web" not in body
    os.unlink(secret)  # the only name left: a file like any other
    status, _, body = fetch(port, "/report/notes.txt")
    assert (status, body) == (200, b"not for the web")


def test_an_over_long_header_is_431_and_an_over_long_url_414(served_reports):
    port, _ = served_reports
    for head, code in (
        (b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n", b"431"),
        (b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: /" + b"a" * 9000 + b"\r\n\r\n", b"431"),
        (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", b"414"),
    ):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(head)
            assert s.recv(100).split(b" ")[1] == code
    assert fetch(port, "/health")[0] == 200


@pytest.mark.slow
def test_half_sent_requests_do_not_starve_health(served_reports):
    port, _ = served_reports
    half = []
    try:
        for _ in range(64 + 16):  # every connection serve allows, and some waiting in the backlog
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(b"GET /report/ HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            half.append(s)
        started = time.monotonic()
        status, _, _body = fetch(port, "/health")
        took = time.monotonic() - started
        assert status == 200 and took < 1.0, took
    finally:
        for s in half:
            s.close()


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.slow
def test_clients_that_do_not_read_a_large_report_file_cost_no_copy_of_it(served_reports):
    """20 clients ask for a 31 MB file and read nothing: each holds a chunk and a transport
    buffer, not the file (before, each answer was the whole file in memory: +620 MB). A client
    that does read gets every byte."""
    port, cfg = served_reports
    big = cfg.state_dir / "reports" / "2026-11-30" / "big.csv"
    block = os.urandom(1 << 20)
    with big.open("wb") as f:
        for _ in range(31):
            f.write(block)
    before = _rss_mib()
    stalled = []
    try:
        for _ in range(20):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.sendall(b"GET /report/big.csv HTTP/1.1\r\nHost: x\r\n\r\n")
            stalled.append(s)
        time.sleep(1.5)  # the server writes what the sockets take, then waits
        grown = _rss_mib() - before
        assert grown < 40, f"RSS grew {grown:.1f} MiB for 20 clients that do not read"
        status, headers, body = fetch(port, "/report/big.csv")
        assert (status, int(headers["content-length"]), len(body)) == (200, 31 << 20, 31 << 20)
        assert body[: 1 << 20] == block and body[-(1 << 20) :] == block
        assert fetch(port, "/health")[0] == 200
    finally:
        for s in stalled:
            s.close()
    print(f"RSS +{grown:.1f} MiB for 20 clients not reading a 31 MiB file")


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path):
    os.mkfifo(tmp_path / "plan.json")
    files = ReportFiles(reports_dir=tmp_path / "reports", plan_path=tmp_path / "plan.json")
    result: list[int] = []
    reader = threading.Thread(target=lambda: result.append(files.answer("/plan.json").status), daemon=True)
    reader.start()
    reader.join(5)
    assert result == [404]
