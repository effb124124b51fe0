"""The adapter's one memory budget for Prometheus answers (adapter.clients.membudget, used by
adapter.clients.prometheus), against a stand-in Prometheus streaming huge answers on 127.0.0.1
(devkit.hugeanswer): a refused answer leaves no reference to its bytes, even held as the refresher
holds its last error; answers read at once stay under the budget together, those that cannot fit are
refused with one line naming --memory-budget; identical queries in flight are sent once; the default
comes from the cgroup memory limit; the resident memory of a process under 20 concurrent
1,000,000-series answers stays bounded."""

from __future__ import annotations

import contextlib
import functools
import gc
import sys
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from adapter.clients import membudget
from adapter.clients.prometheus import PrometheusClient
from adapter.errors import PrometheusUnavailable
from adapter.provider.refresh import RefreshingCache
from devkit.hugeanswer import HugeAnswerServer, answer_labels, answer_size, run_measured
from gpupilot_common import promanswer

REPO = Path(__file__).resolve().parents[3]
MiB = 1 << 20


@pytest.fixture(scope="module")
def million() -> Iterator[HugeAnswerServer]:
    with HugeAnswerServer(1_000_000) as server:
        yield server


@pytest.fixture(scope="module")
def ten_thousand() -> Iterator[HugeAnswerServer]:
    with HugeAnswerServer(10_000) as server:
        yield server


@pytest.mark.slow
def test_a_refused_answer_leaves_no_reference_to_its_bytes(million: HugeAnswerServer) -> None:
    client = PrometheusClient(million.url, limits=promanswer.AnswerLimits(max_bytes=MiB))
    cache: RefreshingCache[object] = RefreshingCache(interval=60, idle_drop=600, max_age=120)
    kept: list[BaseException] = []
    with contextlib.suppress(PrometheusUnavailable):
        client.query("warm up")  # the session, the loop and the pools exist before measuring
    tracemalloc.start()
    try:
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        for i in range(4):
            with pytest.raises(
                PrometheusUnavailable, match=r"more than 1,048,576 bytes \(--max-answer-bytes\)"
            ):
                client.query(f"q{i}")
            # as the refresher keeps a key's last error, and serves it to every request
            with pytest.raises(PrometheusUnavailable) as info:
                cache.get(f"k{i}", functools.partial(client.query, f"r{i}"), wait=10)
            kept.append(info.value)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
        client.close()
    # 8 refused answers of 1 MiB each: none of them is still referenced
    assert grown < MiB, f"{grown / MiB:.1f} MiB still referenced after 8 refused answers"
    for error in kept:
        assert error.__context__ is None and error.__cause__ is None


@pytest.mark.slow
def test_answers_read_at_once_stay_under_the_budget(ten_thousand: HugeAnswerServer) -> None:
    budget = membudget.MemoryBudget(48 * MiB, wait=5.0)
    client = PrometheusClient(ten_thousand.url, timeout=30, budget=budget)
    got: list[int] = []
    refused: list[str] = []
    lock = threading.Lock()

    start = threading.Barrier(16)

    def ask(i: int) -> None:
        start.wait()
        try:
            samples = client.query(f"distinct_{i}")  # distinct queries: nothing coalesced
        except PrometheusUnavailable as exc:
            with lock:
                refused.append(str(exc))
        else:
            with lock:
                got.append(len(samples))

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(16)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        client.close()
    each = membudget.parse_cost(answer_size(10_000), 10_000, answer_labels(10_000))  # ~21 MiB per answer
    # the oldest read in flight always finishes; younger ones that do not fit stop and give back
    assert len(got) + len(refused) == 16 and got and set(got) == {10_000}, refused
    for message in refused:
        assert "memory budget for Prometheus answers (--memory-budget 48 MiB) is taken" in message
    assert each * 2 < budget.peak <= budget.limit
    assert budget.used == 0 and client.coalesced == 0


def test_an_answer_over_the_whole_budget_is_refused_naming_it(million: HugeAnswerServer) -> None:
    budget = membudget.MemoryBudget(16 * MiB)
    client = PrometheusClient(million.url, budget=budget)
    try:
        with pytest.raises(PrometheusUnavailable) as info:
            client.query("DCGM_FI_DEV_GPU_UTIL")
    finally:
        client.close()
    message = str(info.value)
    assert message.startswith(f"Prometheus at {million.url}: the answer to 'DCGM_FI_DEV_GPU_UTIL' is over ")
    assert "would take more than the adapter's whole memory budget for Prometheus answers" in message
    assert "--memory-budget 16 MiB" in message and "\n" not in message
    assert info.value.__context__ is None
    assert budget.used == 0 and budget.refused == 1


def test_a_full_budget_refuses_after_a_short_wait(million: HugeAnswerServer) -> None:
    budget = membudget.MemoryBudget(16 * MiB, wait=0.2)
    client = PrometheusClient(million.url, budget=budget)
    held = budget.lease("'someone else'")
    try:
        assert budget._try(held, 15 * MiB)  # another answer holds most of it
        with pytest.raises(PrometheusUnavailable, match="is taken by other answers being read"):
            client.query("up")
    finally:
        held.release()
        client.close()
    assert budget.used == 0


@pytest.mark.slow
def test_identical_queries_in_flight_are_sent_once() -> None:
    with HugeAnswerServer(60_000) as server:
        client = PrometheusClient(server.url, timeout=30)
        start = threading.Barrier(8)
        got: list[int] = []

        def ask() -> None:
            start.wait()
            got.append(len(client.query('sum by (pod) (DCGM_FI_DEV_GPU_UTIL{namespace="ai"})')))

        threads = [threading.Thread(target=ask) for _ in range(8)]
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
        finally:
            client.close()
        assert got == [60_000] * 8
        # eight callers at once: (nearly) all wait for the first one's answer instead of asking again
        assert client.coalesced >= 4
        sent = round(server.bytes_sent / answer_size(60_000))
        assert sent == 8 - client.coalesced, (sent, client.coalesced)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("201326592\n", 96 * MiB),  # the chart's 192Mi
        ("max\n", membudget.DEFAULT_BYTES),
        ("9223372036854771712\n", membudget.DEFAULT_BYTES),  # cgroup v1's "no limit"
        (None, membudget.DEFAULT_BYTES),
    ],
)
def test_the_default_is_half_the_container_memory_limit(
    tmp_path: Path, text: str | None, expected: int
) -> None:
    path = tmp_path / "memory.max"
    if text is not None:
        path.write_text(text)
    assert membudget.default_budget((path,)) == expected


SCRIPT = """
import sys, threading
from adapter.clients import membudget
from adapter.clients.prometheus import PrometheusClient
budget = None if sys.argv[2] == "none" else membudget.MemoryBudget(int(sys.argv[2]) << 20)
client = PrometheusClient(sys.argv[1], timeout=60, budget=budget)
outcomes = []
def ask(i):
    try:
        client.query(f"q{i}")
        outcomes.append("ok")
    except Exception as exc:
        outcomes.append(type(exc).__name__)
threads = [threading.Thread(target=ask, args=(i,)) for i in range(20)]
for t in threads: t.start()
for t in threads: t.join()
client.close()
print(sorted(set(outcomes)), file=sys.stderr)
"""


@pytest.mark.slow
def test_twenty_concurrent_million_series_answers_stay_under_the_budget(million: HugeAnswerServer) -> None:
    """Without a budget the same 20 reads took the process past 300 MiB (each stops at the
    100,000-series limit, about 19 MiB, and they are read at once)."""
    run = run_measured([sys.executable, "-c", SCRIPT, million.url, "96"], cwd=REPO, limit=90)
    assert run.code == 0, run.stderr
    assert run.stderr.strip() == "['PrometheusUnavailable']"
    assert run.peak_rss < 160 * MiB, f"peaked at {run.peak_rss / MiB:.0f} MiB"


@pytest.mark.slow
def test_values_kept_in_memory_hold_the_budget_until_dropped(ten_thousand: HugeAnswerServer) -> None:
    budget = membudget.MemoryBudget(64 * MiB)
    client = PrometheusClient(ten_thousand.url, timeout=30, budget=budget)
    now = [0.0]
    cache: RefreshingCache[object] = RefreshingCache(
        interval=10, idle_drop=100, max_age=0, budget=budget, clock=lambda: now[0]
    )
    size = membudget.held_cost(answer_size(10_000), 10_000, answer_labels(10_000))  # ~13 MiB
    try:
        value = cache.get("a", functools.partial(client.query, "a"), wait=30).value
        assert len(value) == 10_000  # type: ignore[arg-type]
        assert (budget.held, budget.used) == (size, size)  # the read's charge given back, the value held
        cache.get("b", functools.partial(client.query, "b"), wait=30)
        assert budget.held == 2 * size

        def refreshed(count: int) -> None:
            deadline = time.monotonic() + 30
            while cache.refreshes < count and time.monotonic() < deadline:
                time.sleep(0.01)
            assert cache.refreshes == count

        now[0] = 20.0
        assert cache.refresh_due() == 2
        refreshed(4)
        assert budget.held == 2 * size  # each refresh's value replaces its hold
        now[0] = 120.0
        cache.get("b", functools.partial(client.query, "b"), wait=30)  # b asked again; a not
        now[0] = 150.0
        cache.refresh_due()  # a: idle past 100 s, dropped with its hold; b refreshed
        refreshed(5)
        assert budget.held == size and len(cache) == 1
    finally:
        cache.stop()
        client.close()


@pytest.mark.slow
def test_a_value_over_the_half_values_may_hold_is_served_not_kept(
    ten_thousand: HugeAnswerServer, caplog: pytest.LogCaptureFixture
) -> None:
    budget = membudget.MemoryBudget(24 * MiB)  # values may hold 12 MiB: less than one answer's 13.2
    client = PrometheusClient(ten_thousand.url, timeout=30, budget=budget)
    cache: RefreshingCache[object] = RefreshingCache(interval=10, idle_drop=100, max_age=0, budget=budget)
    try:
        for _ in range(3):
            value = cache.get("a", functools.partial(client.query, "a"), wait=30).value
            assert len(value) == 10_000  # type: ignore[arg-type]
            assert len(cache) == 0 and budget.used == 0
    finally:
        cache.stop()
        client.close()
    lines = [r.getMessage() for r in caplog.records if "not kept in memory" in r.getMessage()]
    assert len(lines) == 1 and "--memory-budget 24 MiB" in lines[0]


COMPACT_SCRIPT = """
import sys, threading
from adapter.clients import membudget
from adapter.clients.prometheus import PrometheusClient
from gpupilot_common.promanswer import AnswerLimits
budget = membudget.MemoryBudget(int(sys.argv[2]) << 20)
limits = AnswerLimits(max_bytes=64 << 20, max_series=int(sys.argv[4]))
client = PrometheusClient(sys.argv[1], timeout=60, budget=budget, limits=limits)
outcomes = []
def ask(i):
    try:
        client.query(f"q{i}")
        outcomes.append("ok")
    except Exception as exc:
        outcomes.append(type(exc).__name__)
threads = [threading.Thread(target=ask, args=(i,)) for i in range(int(sys.argv[3]))]
for t in threads: t.start()
for t in threads: t.join()
client.close()
print(sorted(set(outcomes)), budget.peak >> 20, file=sys.stderr)
"""
CHART_LIMIT = 192 * MiB
"""The chart's memory limit for the adapter (values.yaml adapter.resources.limits.memory): the
default budget is half of it."""


@pytest.mark.slow
@pytest.mark.parametrize(("series", "readers"), [(40_000, 20), (200_000, 1)])
def test_compact_answers_keep_the_process_under_the_charts_limit(series: int, readers: int) -> None:
    """Compact answers (two short labels a series) take about 14x their bytes once parsed, not 6x:
    charged 6x, twenty 2.6 MB answers read at once took the process past the chart's 192 MiB, and
    one 13.6 MiB answer was admitted to a 96 MiB budget and took 310 MiB. Charged what they cost,
    the readers that fit go through, the others are refused in one line, and the process stays
    under the limit."""
    with HugeAnswerServer(series, shape="compact") as server:
        run = run_measured(
            [sys.executable, "-c", COMPACT_SCRIPT, server.url, "96", str(readers), "250000"],
            cwd=REPO,
            limit=120,
        )
    assert run.code == 0, run.stderr
    outcomes, peak_charge = run.stderr.strip().rsplit(" ", 1)
    if series == 200_000:
        assert outcomes == "['PrometheusUnavailable']"  # alone more than the whole budget
    else:
        assert "'ok'" in outcomes and int(peak_charge) <= 96, run.stderr
    assert run.peak_rss < CHART_LIMIT, f"peaked at {run.peak_rss / MiB:.0f} MiB"
