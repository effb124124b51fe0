"""The ResourceSlice watcher outlives whatever its API does: an answer cut inside a chunk (list or
watch), a watch the server ends at once (reopened after a growing pause, not thousands of times a
second), an answer trickled a byte at a time (cut at the deadline, headers included), an exception
nobody foresaw; each failure is one line and a count, and the last good index stays."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator

import pytest

from exporter.attribute import kubeapi
from exporter.attribute.podresources import dra
from tests.support.common.rawhttp import FakeApi, chunked
from tests.support.common.trickle import trickling

NODE = "node-a"


def _slice(uuid: str) -> dict[str, object]:
    return {
        "metadata": {"name": f"{NODE}-gpu", "resourceVersion": "5"},
        "spec": {
            "driver": dra.NVIDIA_DRIVER,
            "nodeName": NODE,
            "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0", "attributes": {"uuid": {"string": uuid}}}],
        },
    }


LIST = json.dumps({"metadata": {"resourceVersion": "5"}, "items": [_slice("GPU-good")]}).encode()


@pytest.fixture
def api_factory() -> Iterator[Callable[[Callable[[str], bytes]], FakeApi]]:
    made: list[FakeApi] = []

    def make(answer: Callable[[str], bytes]) -> FakeApi:
        made.append(FakeApi(answer))
        return made[-1]

    yield make
    for api in made:
        api.close()


def watcher_for(url: str, **options: float) -> kubeapi.SliceWatcher:
    access = kubeapi.ApiAccess(
        url=url, token_file=None, ca_file=None, timeout_s=options.pop("timeout_s", 2.0)
    )
    return kubeapi.SliceWatcher(access, node=NODE, backoff_max_s=options.pop("backoff_max_s", 0.2), **options)  # type: ignore[arg-type]


def wait_until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.mark.slow
@pytest.mark.parametrize("where", ["list", "watch"])
def test_an_answer_cut_inside_a_chunk_is_a_counted_failure_not_the_end(where, api_factory, caplog):
    state = {"cut": False}

    def answer(path: str) -> bytes:
        if "watch=true" in path:
            return chunked(b'{"type":"ADDED","object":' + json.dumps(_slice("GPU-x")).encode(), cut=True)
        return chunked(LIST, cut=state["cut"])

    api = api_factory(answer)
    watcher = watcher_for(api.url).start()
    try:
        wait_until(lambda: watcher.failures.get("resourceslices") >= 2)  # the watch is cut every time
        assert watcher.current()[0] == {(NODE, "gpu-0"): dra.SliceDevice(uuid="GPU-good")}  # kept
        if where == "list":
            state["cut"] = True
            lists = api.count("resourceslices?")
            wait_until(lambda: api.count("resourceslices?") > lists + 1)
            assert watcher.current()[0] == {(NODE, "gpu-0"): dra.SliceDevice(uuid="GPU-good")}
        assert watcher._thread is not None and watcher._thread.is_alive()
    finally:
        watcher.stop()
    lines = [r.getMessage() for r in caplog.records if "ResourceSlices" in r.getMessage()]
    assert lines and all("\n" not in line for line in lines)
    assert any("IncompleteRead" in line for line in lines), lines


@pytest.mark.slow
def test_a_watch_the_server_ends_at_once_is_not_reopened_at_once(api_factory):
    def answer(path: str) -> bytes:
        return chunked(b"") if "watch=true" in path else chunked(LIST)

    api = api_factory(answer)
    watcher = watcher_for(api.url, backoff_max_s=2.0).start()
    try:
        time.sleep(3.0)
    finally:
        watcher.stop()
    watches = api.count("watch=true")
    assert 2 <= watches <= 12, watches  # 0.5 s doubling (with jitter) to 2 s over 3 s; it was thousands
    assert api.count("watch=true") - watches <= 1  # and it stopped


@pytest.mark.slow
def test_a_trickled_list_is_cut_at_its_deadline_headers_included():
    with trickling(chunked(LIST), every_s=0.2) as url:
        watcher = watcher_for(url, timeout_s=1.0)
        started = time.monotonic()
        with pytest.raises(kubeapi.KubeApiError, match=r"no complete answer within 1s"):
            watcher.list_once()
        assert time.monotonic() - started < 2.5  # the head alone would take 20 s


@pytest.mark.slow
def test_an_unforeseen_exception_in_the_loop_is_survived(api_factory, monkeypatch):
    api = api_factory(lambda path: chunked(b"") if "watch=true" in path else chunked(LIST))
    watcher = watcher_for(api.url)
    real = watcher.list_once
    calls = {"n": 0}

    def flaky() -> str:
        calls["n"] += 1
        if calls["n"] == 1:
            raise ZeroDivisionError("nobody saw this coming")
        return real()

    monkeypatch.setattr(watcher, "list_once", flaky)
    watcher.start()
    try:
        wait_until(lambda: watcher.lists >= 1)
        assert watcher.failures.get("resourceslices") == 1
        assert watcher.current()[0] == {(NODE, "gpu-0"): dra.SliceDevice(uuid="GPU-good")}
    finally:
        watcher.stop()
