"""A 1,000,000-series Prometheus answer (a stand-in streaming it on 127.0.0.1): the adapter and
``plan`` stop reading at their series limit and exit with one line naming the query and the flag,
within their timeout, the adapter under 400 MiB and ``plan`` under 1 GiB of resident memory
(sampled with psutil while they run)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from devkit.hugeanswer import HugeAnswerServer, run_measured

REPO = Path(__file__).resolve().parents[2]
SERIES = 1_000_000
MiB = 1 << 20


@pytest.fixture(scope="module")
def huge() -> Iterator[HugeAnswerServer]:
    with HugeAnswerServer(SERIES) as server:
        yield server


@pytest.mark.slow
def test_the_adapter_refuses_a_million_series_in_bounded_memory(huge: HugeAnswerServer) -> None:
    run = run_measured(
        [
            sys.executable,
            "-m",
            "adapter",
            "explain-hpa",
            "-f",
            "examples/hpa-llm-inference.yaml",
            "--prometheus-url",
            huge.url,
            "--prometheus-timeout",
            "30",
        ],
        cwd=REPO,
        limit=60,
    )
    code, err, peak, took = run.code, run.stderr, run.peak_rss, run.seconds
    assert code == 1 and took < 30, (code, took, err)
    assert err.strip() == (
        f"gpupilot-adapter explain-hpa: Prometheus at {huge.url}: the answer to "
        "'kube_pod_labels{namespace=\"ai-serving\"}' holds more than 100,000 series (--max-answer-series); "
        "narrow the query or raise the limit"
    )
    assert peak < 400 * MiB, f"adapter peaked at {peak / MiB:.0f} MiB"


@pytest.mark.slow
def test_plan_refuses_a_million_series_in_bounded_memory(huge: HugeAnswerServer, tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    out.write_text("the previous plan")
    run = run_measured(
        [
            sys.executable,
            "-m",
            "rightsizer",
            "plan",
            "--prometheus-url",
            huge.url,
            "--out",
            str(out),
            "--timeout",
            "60",
            "--quiet",
        ],
        cwd=REPO,
        limit=120,
    )
    code, err, peak, took = run.code, run.stderr, run.peak_rss, run.seconds
    assert code == 1 and took < 60, (code, took, err)
    assert err.strip() == (
        f"error: Prometheus at {huge.url}: the answer to 'last_over_time(gpupilot_gpu_info[900s])' holds "
        "more than 200,000 series (--max-answer-series); narrow the query or raise the limit"
    )
    assert peak < 1024 * MiB, f"plan peaked at {peak / MiB:.0f} MiB"
    assert out.read_text() == "the previous plan"


@pytest.mark.slow
def test_the_demo_query_helper_reads_through_the_same_bounds(huge: HugeAnswerServer) -> None:
    from devkit.demo import promql  # noqa: PLC0415 - the demo's door, only here

    with pytest.raises(promql.QueryError) as err:
        promql.query(huge.url, "up", timeout=30)
    assert str(err.value) == (
        f"Prometheus at {huge.url}: the answer to 'up' holds more than 100,000 series "
        "(--max-answer-series); narrow the query or raise the limit"
    )
