"""The rightsizer's memory under hostile Prometheus answers (a stand-in streaming 1,000,000 series on
127.0.0.1, devkit.hugeanswer): an answer refused over a limit or cut off at the deadline leaves no
reference to what was read, even when the error is kept (serve records its jobs' last failures);
``plan`` refusing an answer over --max-answer-bytes, and ``serve`` refusing huge answers to its plan
and its first report, stay under the chart's memory limit for the rightsizer (resident memory
sampled with psutil while the real commands run)."""

from __future__ import annotations

import contextlib
import gc
import re
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import yaml

import devkit.hugeanswer as hugeanswer
from devkit.hugeanswer import HugeAnswerServer, run_measured
from gpupilot_common import promanswer
from rightsizer.clients.prometheus import PrometheusClient, PrometheusError

REPO = Path(__file__).resolve().parents[3]
MiB = 1 << 20
_UNITS = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}


def chart_memory_limit() -> int:
    """``rightsizer.resources.limits.memory`` of the chart's values, in bytes."""
    values = yaml.safe_load((REPO / "deploy/helm/gpupilot/values.yaml").read_text())
    found = re.fullmatch(r"(\d+)(Ki|Mi|Gi)", values["rightsizer"]["resources"]["limits"]["memory"])
    assert found, "the rightsizer's memory limit is not a whole number of Ki/Mi/Gi"
    return int(found[1]) * _UNITS[found[2]]


@pytest.fixture(scope="module")
def million() -> Iterator[HugeAnswerServer]:
    with HugeAnswerServer(1_000_000) as server:
        yield server


@pytest.fixture
def fat_series(monkeypatch: pytest.MonkeyPatch) -> None:
    """Series of about 800 bytes (a long label), so 200,000 of them are over 128 MiB: the byte limit
    is reached before the series limit at the default limits."""
    plain = hugeanswer.series_block
    pad = b'"namespace":"ai-serving","pad":"' + b"x" * 600 + b'"'

    def fat(start: int, count: int) -> bytes:
        return plain(start, count).replace(b'"namespace":"ai-serving"', pad)

    monkeypatch.setattr(hugeanswer, "series_block", fat)


def _client_side_bytes() -> int:
    """Bytes traced outside the answer server's threads: the server runs in this process, and on a
    loaded machine its handlers may still be building blocks for a client that has hung up."""
    server_side = tracemalloc.Filter(False, "*/socketserver.py", all_frames=True)
    snapshot = tracemalloc.take_snapshot().filter_traces([server_side])
    return sum(stat.size for stat in snapshot.statistics("filename"))


@pytest.mark.slow
def test_a_refused_or_timed_out_answer_leaves_no_reference_to_its_bytes(million: HugeAnswerServer) -> None:
    over = PrometheusClient(million.url, limits=promanswer.AnswerLimits(max_series=10**7, max_bytes=4 * MiB))
    late = PrometheusClient(million.url, timeout=0.3)  # the default limits: cut off by the deadline
    for client in (over, late):
        with contextlib.suppress(PrometheusError):
            client.instant("warm up")  # the session and its pool exist before measuring
    kept: list[PrometheusError] = []
    tracemalloc.start(8)  # deep enough to see the server handler's socketserver frames
    try:
        gc.collect()
        before = _client_side_bytes()
        for i in range(3):
            for client, expected in ((over, "more than 4,194,304 bytes"), (late, "timed out after 0.3 s")):
                with pytest.raises(PrometheusError, match=expected) as info:
                    client.instant(f"q{i}")
                kept.append(info.value)  # as serve keeps a job's last failure
        gc.collect()
        grown = _client_side_bytes() - before
    finally:
        tracemalloc.stop()
        over.close()
        late.close()
    # six answers, several MiB read of each: none of it is still referenced by the errors
    assert grown < MiB // 4, f"{grown / MiB:.1f} MiB still referenced by 6 kept errors"
    for error in kept:
        assert error.__context__ is None and error.__cause__ is None


@pytest.mark.slow
@pytest.mark.usefixtures("fat_series")
def test_plan_refusing_an_answer_over_the_byte_limit_stays_under_the_charts_limit(tmp_path: Path) -> None:
    with HugeAnswerServer(1_000_000) as fat:
        run = run_measured(
            [
                sys.executable,
                "-m",
                "rightsizer",
                "plan",
                "--prometheus-url",
                fat.url,
                "--out",
                str(tmp_path / "plan.json"),
                "--quiet",
            ],
            cwd=REPO,
            limit=120,
        )
    assert run.code == 1, (run.code, run.stderr)
    assert run.stderr.strip().endswith(
        "holds more than 134,217,728 bytes (--max-answer-bytes); narrow the query or raise the limit"
    ), run.stderr
    assert run.peak_rss < chart_memory_limit(), f"plan peaked at {run.peak_rss / MiB:.0f} MiB"


@pytest.mark.slow
@pytest.mark.usefixtures("fat_series")
def test_serve_refusing_huge_answers_stays_under_the_charts_limit(tmp_path: Path) -> None:
    """serve's first plan and its first report (written at start when none exists) both meet an
    answer over 128 MiB; it records both failures, keeps serving, and its memory stays bounded."""
    with HugeAnswerServer(1_000_000) as fat:
        config = tmp_path / "serve.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "prometheus_url": fat.url,
                    "timezone": "UTC",
                    "listen": "127.0.0.1:0",
                    "state_dir": str(tmp_path / "state"),
                    "report": {"schedule": "mon 06:00", "window": "7d"},
                    "plan": {"every": "1h", "window": "7d"},
                }
            )
        )
        log = tmp_path / "serve.log"
        with log.open("wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "rightsizer", "serve", "--config", str(config)],
                cwd=REPO,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        watched, peak, started = psutil.Process(proc.pid), 0, time.monotonic()
        try:
            while time.monotonic() - started < 90 and proc.poll() is None:
                peak = max(peak, watched.memory_info().rss)
                text = log.read_text(errors="replace")
                if "plan job failed" in text and "report job failed" in text:
                    break
                time.sleep(0.01)
            running = proc.poll() is None
        finally:
            proc.terminate()
            proc.wait(30)
        sent = fat.bytes_sent
    text = log.read_text(errors="replace")
    assert running, text[-2000:]
    assert text.count("holds more than 134,217,728 bytes (--max-answer-bytes)") >= 2, text[-2000:]
    assert sent >= 2 * 128 * MiB  # two answers read up to the limit
    assert peak < chart_memory_limit(), f"serve peaked at {peak / MiB:.0f} MiB"
