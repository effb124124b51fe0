"""The adapter's pod list+watch against the API double: expired watches (in-stream 410) relist once
at once and then back off; BOOKMARKs keep a quiet watch resumable; RBAC from deploy/ suffices."""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from adapter.clients.kube import KubeClient, PodRecord
from tests.support.common.rawhttp import FakeApi, chunked
from tests.support.kubedouble import KubeDouble

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"


class Watcher:
    def __init__(self, kube: KubeDouble, kubeconfig: Path, *, timeout_seconds: int = 300) -> None:
        self.kube = kube
        self.client = KubeClient(kubeconfig=str(kubeconfig))
        self.pods: dict[str, PodRecord] = {}
        self.resets = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(
            target=self.client.watch_pods,
            kwargs={
                "on_reset": self._reset,
                "on_event": self._event,
                "stop": self.stop,
                "timeout_seconds": timeout_seconds,
            },
            daemon=True,
        )
        self.thread.start()

    def _reset(self, pods: list[PodRecord]) -> None:
        self.resets += 1
        self.pods = {p.name: p for p in pods}

    def _event(self, kind: str, pod: PodRecord) -> None:
        if kind == "DELETED":
            self.pods.pop(pod.name, None)
        else:
            self.pods[pod.name] = pod

    def close(self) -> None:
        self.stop.set()
        if not self.kube.store.closed:  # an event wakes the watch, which then sees ``stop``
            self.kube.add_pod(f"wake-{id(self)}", node="n")
        self.thread.join(timeout=10)
        self.client.close()


@pytest.fixture
def watcher_of(tmp_path: Path) -> Iterator:  # type: ignore[type-arg]
    made: list[Watcher] = []

    def make(kube: KubeDouble, **kw: int) -> Watcher:
        w = Watcher(kube, kube.write_kubeconfig(tmp_path / "kc"), **kw)
        made.append(w)
        return w

    yield make
    for w in made:
        w.close()


def lists(kube: KubeDouble) -> int:
    return sum(
        1
        for method, path in kube.api.request_log
        if method == "GET" and urllib.parse.urlsplit(path).path == "/api/v1/pods" and "watch=" not in path
    )


@pytest.mark.slow
def test_repeated_410_backs_off_instead_of_relisting_in_a_loop(watcher_of) -> None:
    with KubeDouble() as kube:
        kube.add_pod("a", node="n")
        w = watcher_of(kube)
        kube.wait_for(lambda: w.resets == 1, timeout=5)
        kube.expire_watches(None)  # every watch from now on: 410 Expired at once
        start = lists(kube)
        time.sleep(2.0)
        relists = lists(kube) - start
        # first 410: relist at once; then 0.5 s, 1 s, … (before the fix: 160 lists in 2 s here)
        assert 1 <= relists <= 5, relists
        kube.expire_watches(0)
        kube.add_pod("b", node="n")
        kube.wait_for(lambda: "b" in w.pods, timeout=10)


@pytest.mark.slow
def test_a_single_expiry_relists_at_once(watcher_of) -> None:
    with KubeDouble() as kube:
        kube.add_pod("a", node="n")
        w = watcher_of(kube, timeout_seconds=1)
        kube.wait_for(lambda: w.resets == 1, timeout=5)
        kube.add_pod("b", node="n")
        kube.compact()  # the watch's position is gone when it reconnects
        kube.add_pod("c", node="n")
        kube.wait_for(lambda: {"a", "b", "c"} <= set(w.pods), timeout=5)
        kube.compact()
        kube.wait_for(lambda: w.resets == 2, timeout=5)


@pytest.mark.slow
def test_bookmarks_keep_a_quiet_watch_resumable(watcher_of) -> None:
    with KubeDouble(bookmark_interval_s=0.1) as kube:
        kube.add_pod("a", node="n")
        kube.add_node("gpu-a")
        w = watcher_of(kube, timeout_seconds=1)
        kube.wait_for(lambda: w.resets == 1, timeout=5)
        for i in range(5):  # other kinds move the resourceVersion; no pod event reaches the watch
            kube.set_node_label("gpu-a", "i", str(i))
        now = kube.store.resource_version
        kube.wait_for(
            lambda: now in kube.api.bookmarks_sent, timeout=5, what="a bookmark at the latest version"
        )
        kube.compact(up_to=now)  # everything before the bookmark is gone
        seen = len(kube.api.request_log)
        kube.wait_for(  # the watch times out (1 s) and resumes from the bookmark's version
            lambda: any(
                "watch=" in path and f"resourceVersion={now}" in path
                for _, path in kube.api.request_log[seen:]
            ),
            timeout=10,
            what="a watch resumed from the bookmark's version",
        )
        assert w.resets == 1 and lists(kube) == 1
        kube.add_pod("b", node="n")
        kube.wait_for(lambda: "b" in w.pods, timeout=5)


@pytest.mark.slow
def test_the_adapter_service_account_can_list_and_watch_pods(watcher_of, tmp_path: Path) -> None:
    with KubeDouble() as kube:
        kube.load_rbac(DEPLOY / "adapter")
        token = kube.add_service_account("gpupilot", "gpupilot-adapter")
        kube.add_pod("a", node="n")
        cfg = kube.write_kubeconfig(tmp_path / "kc-sa", token=token)
        w = Watcher(kube, cfg)
        try:
            kube.wait_for(lambda: w.resets == 1 and "a" in w.pods, timeout=5)
            kube.add_pod("b", node="n")
            kube.wait_for(lambda: "b" in w.pods, timeout=5)
            reviewed = w.client.token_review(token)
            assert reviewed is not None
        finally:
            w.close()
        denied = [a for a in kube.actions() if a.verb == "review" and not a.detail.get("allowed")]
        assert denied == []


def watches(kube: KubeDouble) -> int:
    return sum(1 for method, path in kube.api.request_log if method == "GET" and "watch=" in path)


@pytest.mark.slow
def test_a_watch_the_server_ends_at_once_is_not_reopened_at_once(tmp_path: Path) -> None:
    """An API server that ends every watch at once without an event: reopened after a growing pause
    (0.5 s doubling, jittered), not as fast as the client can ask."""
    pod_list = json.dumps({"kind": "PodList", "metadata": {"resourceVersion": "7"}, "items": []}).encode()
    api = FakeApi(lambda path: chunked(b"") if "watch=" in path else chunked(pod_list))
    kubeconfig = tmp_path / "kc"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": api.url}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    client = KubeClient(kubeconfig=str(kubeconfig))
    stop = threading.Event()
    thread = threading.Thread(
        target=client.watch_pods,
        kwargs={"on_reset": lambda pods: None, "on_event": lambda kind, pod: None, "stop": stop},
        daemon=True,
    )
    thread.start()
    try:
        time.sleep(3.0)
        seen = api.count("watch=")
        assert 2 <= seen <= 8, seen  # thousands in 3 s without the pause
        assert thread.is_alive()
    finally:
        stop.set()
        thread.join(35)
        api.close()
        client.close()


def test_an_unforeseen_failure_of_the_pod_watch_is_counted_and_survived() -> None:
    """watch_pods raising what it does not handle (a pod it cannot read, a bug): one line, counted,
    the index kept, and the watch started again."""
    from adapter.provider.podsource import KubernetesPodSource  # noqa: PLC0415

    class Flaky:
        def __init__(self) -> None:
            self.calls = 0
            self.again = threading.Event()

        def watch_pods(self, *, on_reset, on_event, stop) -> None:
            self.calls += 1
            if self.calls == 1:
                on_reset([PodRecord("ns", "a", {}, "Running", True, False)])
                raise KeyError("metadata")
            self.again.set()
            stop.wait()

    flaky = Flaky()
    failures: list[BaseException] = []
    source = KubernetesPodSource(flaky, on_failure=failures.append)  # type: ignore[arg-type]
    try:
        assert flaky.again.wait(5.0)
        assert [type(f) for f in failures] == [KeyError]
        assert source.namespace_size("ns") == 1  # the index is kept
    finally:
        source.close()
