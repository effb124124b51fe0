"""Every query the adapter (serve, explain-hpa, replay-hpa) and the rightsizer (plan, report) send
gets the same answer from Prometheus 3 (the LTS and the newest) as from Debian's 2.42 over the same
TSDB.

Three days of the shared test fleet (tests/data/fleet-small.yaml) with its recording rules are
backfilled once and frozen: no scrape and no rule runs afterwards, so every server holds exactly
the same samples (each starts on its own copy of the folder: a 3.x TSDB is not opened by 2.42 again).
The history reaches 15 minutes past the fixture's start, so the commands' "now" has data. The
commands run against 2.42 through a recording proxy; each distinct read is then replayed with its
time written out on a fresh 2.42 and on each 3.x, and any answer that differs fails the test, naming
the query and both answers.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from adapter.cli import main as adapter_main
from adapter.serving.app import Adapter
from devkit.history import build_history
from devkit.prometheus import ENGINES, PrometheusServer
from rightsizer.cli import main as rightsizer_main
from tests.adapter.conftest import Client, base_settings
from tests.support.adapter.pki import make_pki
from tests.support.promrecord import Recorded, RecordingProxy, differences, replay

pytestmark = [pytest.mark.compat, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SCENARIO = REPO / "tests" / "data" / "fleet-small.yaml"
SEED_HPA = REPO / "examples" / "hpa-llm-inference.yaml"
RULES = (REPO / "rules" / "recording.rules.yaml", REPO / "rules" / "recording-fleet.rules.yaml")
DAYS = 3
STEP = 60.0
AHEAD = 900.0
COMPARED_WITH = ("3.13", "3.16")


@dataclass(frozen=True)
class Recording:
    by_command: dict[str, list[Recorded]]
    answers: dict[str, list[Any]]
    """Engine name → the answers to :attr:`reads`, in order."""
    reads: list[Recorded]


def _copy(frozen: Path, target: Path) -> Path:
    shutil.copytree(frozen, target)
    return target


def _serve(url: str, base: Path) -> None:
    """The adapter's serve loop over ``url`` (pods from Prometheus), asked as the HPA asks."""
    pki = make_pki(base / "pki")
    adapter = Adapter(base_settings(url, pki))
    adapter.start()
    try:
        client = Client(f"https://127.0.0.1:{adapter.port}", pki)
        v2 = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/ai-serving/pods/*"
        ext = "/apis/external.metrics.k8s.io/v1beta1/namespaces/ai-serving"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            r = client.as_hpa(f"{v2}/DCGM_FI_DEV_GPU_UTIL", {"labelSelector": "app=llm-inference"})
            if r.status_code == 200 and r.json()["items"]:
                break
            time.sleep(0.5)
        else:
            raise AssertionError(f"the adapter served no value within 60 s: {r.status_code} {r.text[:200]}")
        for path in (
            f"{v2}/inference_queue_depth",
            f"{v2}/gpu_utilization",
            f"{ext}/inference_queue_depth_total",
        ):
            assert client.as_hpa(path).status_code == 200, path
        time.sleep(3)  # a refresh round or two
    finally:
        adapter.stop()


def _commands(url: str, base: Path, end: float) -> Iterator[tuple[str, int]]:
    yield "explain-hpa", adapter_main(["explain-hpa", "-f", str(SEED_HPA), "--prometheus-url", url])
    yield (
        "replay-hpa",
        adapter_main(
            [
                "replay-hpa",
                "-f",
                str(SEED_HPA),
                "--prometheus-url",
                url,
                "--since",
                "1d",
                "--until",
                f"{end:.0f}",
            ]
        ),
    )
    yield (
        "plan",
        rightsizer_main(
            [
                "plan",
                "--prometheus-url",
                url,
                "--window",
                f"{DAYS}d",
                "--at",
                f"{end:.0f}",
                "--out",
                str(base / "plan.json"),
                "--quiet",
            ]
        ),
    )
    yield (
        "report",
        rightsizer_main(
            ["report", "--prometheus-url", url, "--out", str(base / "report"), "--window", f"{DAYS}d"]
        ),
    )


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Recording:
    base = tmp_path_factory.mktemp("equivalence")
    now = time.time()
    end = now - now % STEP + AHEAD
    frozen = base / "frozen"
    build_history(
        SCENARIO,
        start=end - DAYS * 86400,
        end=end,
        step=STEP,
        out_dir=frozen,
        rule_files=RULES,
        progress=None,
    )
    for wal in ("wal", "chunks_head"):
        shutil.rmtree(frozen / wal, ignore_errors=True)
    by_command: dict[str, list[Recorded]] = {}
    reference = ENGINES["2.42"]
    with (
        PrometheusServer(_copy(frozen, base / "recorded"), selected=reference) as prom,
        RecordingProxy(prom.url) as proxy,
    ):
        _serve(proxy.url, base)
        by_command["serve"] = list(proxy.recorded)
        for name, code in _commands(proxy.url, base, now):
            assert code == 0, f"{name} failed on Prometheus 2.42"
            by_command[name] = proxy.recorded[sum(len(v) for v in by_command.values()) :]
        reads = proxy.reads()
    answers = {}
    for name in ("2.42", *COMPARED_WITH):
        with PrometheusServer(_copy(frozen, base / f"replay-{name}"), selected=ENGINES[name]) as prom:
            answers[name] = replay(prom.url, reads)
    return Recording(by_command, answers, reads)


def test_every_command_asked_prometheus(recording: Recording) -> None:
    for command, requests in recording.by_command.items():
        queries = [r for r in requests if r.path in ("/api/v1/query", "/api/v1/query_range")]
        assert queries, f"{command} sent no query through the proxy"
    assert len(recording.reads) >= 30


def test_the_reference_answers_are_real_answers(recording: Recording) -> None:
    """Replayed on 2.42 again, most reads return data (the comparison is not between empty answers),
    and none is an error."""
    answers = recording.answers["2.42"]
    errors = [(r.describe(), a) for r, a in zip(recording.reads, answers, strict=True) if "error" in a]
    assert not errors, errors[:3]
    filled = [a for a in answers if (a.get("result") if isinstance(a, dict) else a)]
    assert len(filled) >= 0.6 * len(answers)


@pytest.mark.parametrize("engine", COMPARED_WITH)
def test_prometheus_3_answers_every_query_as_2_42(recording: Recording, engine: str) -> None:
    diffs = differences(recording.reads, recording.answers["2.42"], recording.answers[engine])
    listed = "\n".join(str(d) for d in diffs[:10])
    assert not diffs, (
        f"{len(diffs)} of {len(recording.reads)} answers differ on Prometheus {engine}:\n{listed}"
    )


def test_a_sample_more_or_a_different_value_is_a_difference() -> None:
    """The comparison is not vacuous: only float summation noise passes."""
    from tests.support.promrecord import same  # noqa: PLC0415

    one = {"resultType": "vector", "result": [{"metric": {"pod": "a"}, "value": [1.0, "0.963312"]}]}
    noise = {
        "resultType": "vector",
        "result": [{"metric": {"pod": "a"}, "value": [1.0, "0.9633120000000001"]}],
    }
    other = {"resultType": "vector", "result": [{"metric": {"pod": "a"}, "value": [1.0, "0.9633"]}]}
    more = {"resultType": "vector", "result": [*one["result"], {"metric": {"pod": "b"}, "value": [1.0, "1"]}]}
    assert same(one, noise)
    assert not same(one, other) and not same(one, more)
    assert not same({"values": [[1.0, "1"], [2.0, "1"]]}, {"values": [[2.0, "1"]]})
    assert same({"values": [[1.0, "NaN"]]}, {"values": [[1.0, "NaN"]]})
