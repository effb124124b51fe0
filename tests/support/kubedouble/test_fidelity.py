"""Where the double follows the real API server closely enough for failure paths to be exercised:
injected 429/5xx, expired watches and BOOKMARKs, no-op writes, pruning and size limits, and reviews.
(The project's RBAC is judged by the real control plane: tests/kube.)"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import requests
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from tests.support.common.present import present
from tests.support.kubedouble import KubeDouble

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"


def core(kube: KubeDouble, token: str | None = None) -> client.CoreV1Api:
    return client.CoreV1Api(kube.api_client(token) if token else kube.api_client())


@pytest.mark.slow
def test_faults_once_repeatedly_after_a_skip_and_with_retry_after(kube):
    kube.add_node("gpu-a")
    fault = kube.inject_fault(429, method="GET", path_contains="/nodes/gpu-a", retry_after_s=3, skip=1)
    v1 = core(kube)
    v1.read_node("gpu-a")  # skipped
    answer = requests.get(
        f"{kube.url}/api/v1/nodes/gpu-a",
        headers={"Authorization": "Bearer kubedouble-admin-token"},
        timeout=5,
    )
    assert answer.status_code == 429 and answer.headers["Retry-After"] == "3"
    assert answer.json()["reason"] == "TooManyRequests" and answer.json()["details"]["retryAfterSeconds"] == 3
    v1.read_node("gpu-a")  # once only
    assert fault.hits == 3
    kube.inject_fault(503, path_contains="/api/v1/pods", count=None)
    for _ in range(3):
        with pytest.raises(ApiException) as err:
            v1.list_pod_for_all_namespaces()
        assert err.value.status == 503 and '"ServiceUnavailable"' in str(err.value.body)
    kube.clear_faults()
    v1.list_pod_for_all_namespaces()


@pytest.mark.slow
def test_watch_from_a_compacted_version_gets_an_in_stream_410(kube):
    kube.add_node("gpu-a")
    v1 = core(kube)
    rv = present(v1.list_node().metadata).resource_version
    v1.patch_node("gpu-a", {"metadata": {"labels": {"x": "1"}}})
    kube.compact()
    raw = requests.get(
        f"{kube.url}/api/v1/nodes",
        params={"watch": "true", "resourceVersion": rv},
        headers={"Authorization": "Bearer kubedouble-admin-token"},
        timeout=5,
    )
    assert raw.status_code == 200  # the error is in the stream, as from the watch cache
    event = json.loads(raw.text.splitlines()[0])
    assert event["type"] == "ERROR"
    assert (event["object"]["code"], event["object"]["reason"]) == (410, "Expired")
    assert event["object"]["message"].startswith(f"too old resource version: {rv} (")
    with pytest.raises(ApiException) as err:  # the client retries once itself, then raises
        list(watch.Watch().stream(v1.list_node, resource_version=rv))
    assert err.value.status == 410


@pytest.mark.slow
def test_history_is_bounded():
    with KubeDouble(history_limit=10) as kube:
        kube.add_node("gpu-a")
        v1 = core(kube)
        rv = present(v1.list_node().metadata).resource_version
        for i in range(20):
            v1.patch_node("gpu-a", {"metadata": {"labels": {"i": str(i)}}})
        assert len(kube.store.history) == 10
        with pytest.raises(ApiException) as err:
            list(watch.Watch().stream(v1.list_node, resource_version=rv, timeout_seconds=1))
        assert err.value.status == 410


@pytest.mark.slow
def test_bookmarks_carry_the_latest_resource_version():
    with KubeDouble(bookmark_interval_s=0.1) as kube:
        kube.add_node("gpu-a")
        kube.add_pod("p", node="gpu-a")
        v1 = core(kube)
        rv = present(v1.list_pod_for_all_namespaces().metadata).resource_version
        v1.patch_node("gpu-a", {"metadata": {"labels": {"x": "1"}}})  # not a pod: not sent, but counted
        after = present(v1.read_node("gpu-a").metadata).resource_version
        w = watch.Watch()
        seen = []
        for ev in w.stream(
            v1.list_pod_for_all_namespaces, resource_version=rv, allow_watch_bookmarks=True, timeout_seconds=2
        ):
            seen.append((ev["type"], ev["raw_object"]["metadata"]["resourceVersion"]))
            if ev["type"] == "BOOKMARK":
                w.stop()
        assert seen == [("BOOKMARK", after)]
        plain = list(
            watch.Watch().stream(v1.list_pod_for_all_namespaces, resource_version=rv, timeout_seconds=1)
        )
        assert plain == []  # no bookmarks unless asked for


@pytest.mark.slow
def test_writes_that_change_nothing_keep_the_resource_version(kube):
    kube.add_node("gpu-a")
    v1 = core(kube)
    v1.patch_node("gpu-a", {"metadata": {"labels": {"x": "1"}}})
    rv = present(v1.read_node("gpu-a").metadata).resource_version
    events_before = len(kube.store.history)
    same = v1.patch_node("gpu-a", {"metadata": {"labels": {"x": "1"}}})
    assert present(same.metadata).resource_version == rv
    assert len(kube.store.history) == events_before


def post(kube: KubeDouble, path: str, body: object) -> requests.Response:
    """Raw POST (the client validates bodies itself; a kubectl or an older client does not)."""
    return requests.post(
        f"{kube.url}{path}", json=body, headers={"Authorization": "Bearer kubedouble-admin-token"}, timeout=10
    )


@pytest.mark.slow
def test_unknown_fields_are_dropped_and_sizes_limited(kube):
    cms = "/api/v1/namespaces/gpu-operator/configmaps"
    body = {"metadata": {"name": "c", "bogus": 1}, "data": {"a": "b"}, "spec": {"no": "such"}}
    assert post(kube, cms, body).status_code == 201
    stored = kube.configmap("c")
    assert stored is not None and "spec" not in stored and "bogus" not in stored["metadata"]
    assert stored["data"] == {"a": "b"}
    big = post(kube, cms, {"metadata": {"name": "big"}, "data": {"a": "x" * 1_048_577}})
    assert big.status_code == 422 and "must have at most 1048576 bytes" in big.json()["message"]
    huge = post(kube, cms, {"metadata": {"name": "huge"}, "data": {"a": "x" * 3_200_000}})
    assert huge.status_code == 413 and huge.json()["reason"] == "RequestEntityTooLarge"
    assert kube.configmap("big") is None and kube.configmap("huge") is None


@pytest.mark.slow
def test_token_review_extra_and_subject_access_review_validation(kube):
    token = kube.add_service_account("gpupilot", "gpupilot-adapter")
    authn = client.AuthenticationV1Api(kube.api_client())
    review = authn.create_token_review(client.V1TokenReview(spec=client.V1TokenReviewSpec(token=token)))
    user = present(present(review.status).user)
    assert user.username == "system:serviceaccount:gpupilot:gpupilot-adapter"
    assert present(user.extra)["authentication.kubernetes.io/pod-name"] == ["gpupilot-adapter-0"]
    authz = client.AuthorizationV1Api(kube.api_client())
    for spec in (
        client.V1SubjectAccessReviewSpec(user="u"),  # neither attributes
        client.V1SubjectAccessReviewSpec(
            resource_attributes=client.V1ResourceAttributes(verb="get")
        ),  # no user
    ):
        with pytest.raises(ApiException) as err:
            authz.create_subject_access_review(client.V1SubjectAccessReview(spec=spec))
        assert err.value.status == 422


@pytest.mark.slow
def test_graceful_deletion_is_on_by_default(kube):
    kube.add_pod("a", node="gpu-a", resources={"nvidia.com/gpu": 1})
    done = threading.Event()
    core(kube).delete_namespaced_pod("a", "default")
    assert kube.pods()[0]["metadata"]["deletionTimestamp"]
    kube.wait_for(lambda: not kube.pods(), timeout=3)
    done.set()
    kube.add_pod("b", node="gpu-a")
    core(kube).delete_namespaced_pod("b", "default", grace_period_seconds=0)
    assert not kube.pods()
