"""The adapter's official ``kubernetes`` client against the Kubernetes API double over real HTTP:
pods list+watch as the pod source (no list per request), TokenReview for bearer tokens,
SubjectAccessReview for authorisation (with its short cache), the published request-header CA in
kube-system/extension-apiserver-authentication, and Kubernetes failures as 503."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from adapter.cli import main
from adapter.clients.kube import KubeClient
from adapter.config.settings import AuthSettings, ServeSettings
from adapter.serving.app import Adapter
from tests.adapter.conftest import Client, PromEnv, base_settings
from tests.support.adapter.pki import Pki
from tests.support.kubedouble import KubeDouble

HPA_SA = "system:serviceaccount:kube-system:horizontal-pod-autoscaler"
ADAPTER_SA = "system:serviceaccount:gpupilot:gpupilot-adapter"
DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
PODS_PATH = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/ai-serving/pods/*/DCGM_FI_DEV_GPU_UTIL"
LLM = {"labelSelector": "app=llm-inference"}


@pytest.fixture
def kube_with_pods(tmp_path: Path) -> Iterator[KubeDouble]:
    """The API double as the adapter sees a cluster: no MIG Manager, no ClusterPolicy, and three pods
    in ai-serving (two llm-inference, one embedder)."""
    with KubeDouble(run_mig_manager=False, cluster_policy=False, default_mig_configmap=False) as double:
        for suffix in ("a", "b"):
            double.add_pod(
                f"llm-inference-7d9f-{suffix}", namespace="ai-serving", labels={"app": "llm-inference"}
            )
        double.add_pod("embedder-0", namespace="ai-serving", labels={"app": "embedder"})
        yield double


def kube_settings(prom: PromEnv, pki: Pki, kube: KubeDouble, tmp_path: Path, **auth: object) -> ServeSettings:
    settings = base_settings(prom.url, pki, pod_source="kubernetes")
    # the adapter runs as its ServiceAccount, granted what it asks for (its RBAC as rendered is
    # judged by the real control plane: make e2e finds no request of it refused)
    kube.allow(ADAPTER_SA)
    kube.auth.enforce_rules = True
    token = kube.add_service_account("gpupilot", "gpupilot-adapter")
    kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig", token=token)
    fields: dict[str, Any] = {
        "client_ca_file": pki.client_ca.path,
        "requestheader_client_ca_file": pki.front_proxy_ca.path,
        "requestheader_allowed_names": ("front-proxy-client",),
        "authorization_mode": "subjectaccessreview",
        "cache_ttl": 0.3,
        **auth,
    }
    return ServeSettings(
        **{**settings.__dict__, "kubeconfig": str(kubeconfig), "auth": AuthSettings(**fields)}
    )


def names(r) -> set[str]:
    return {i["describedObject"]["name"] for i in r.json()["items"]}


def wait_for(check: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return False


@pytest.mark.slow
def test_subject_access_review_then_watch_driven_values(
    prom: PromEnv,
    pki: Pki,
    kube_with_pods: KubeDouble,
    tmp_path: Path,
    start_adapter: Callable[[ServeSettings], Adapter],
) -> None:
    gc.unfreeze()
    adapter = start_adapter(kube_settings(prom, pki, kube_with_pods, tmp_path))
    client = Client(f"https://127.0.0.1:{adapter.port}", pki)
    assert wait_for(lambda: client.get("/readyz").status_code == 200)
    # the listed pods (and the rest of the heap) are out of the cyclic collector's full passes
    assert gc.get_freeze_count() > 10_000
    gc.unfreeze()

    denied = client.as_hpa(PODS_PATH, LLM)
    assert denied.status_code == 403
    body = denied.json()
    assert (body["kind"], body["reason"], body["code"]) == ("Status", "Forbidden", 403)
    assert (
        f"user \"{HPA_SA}\" cannot get pods/DCGM_FI_DEV_GPU_UTIL in API group 'custom.metrics.k8s.io'"
        in body["message"]
    )
    reviews = [a for a in kube_with_pods.actions(verb="review") if a.name == HPA_SA]
    assert reviews[-1].detail["attrs"] == {
        "verb": "get",
        "group": "custom.metrics.k8s.io",
        "version": "v1beta2",
        "resource": "pods",
        "namespace": "ai-serving",
        "name": "*",
        "subresource": "DCGM_FI_DEV_GPU_UTIL",
    }

    kube_with_pods.allow(HPA_SA, "get", "*", group="custom.metrics.k8s.io")
    assert wait_for(lambda: client.as_hpa(PODS_PATH, LLM).status_code == 200)  # after the 0.3 s cache
    assert names(client.as_hpa(PODS_PATH, LLM)) == {"llm-inference-7d9f-a", "llm-inference-7d9f-b"}

    # from now on the API server fails every pods request: the watch's index keeps serving
    kube_with_pods.inject_fault(503, path_contains="/pods", count=1000)
    reviews_before = len(kube_with_pods.actions(verb="review"))
    for _ in range(5):
        assert client.as_hpa(PODS_PATH, LLM).status_code == 200
    assert (
        len(kube_with_pods.actions(verb="review")) - reviews_before <= 1
    )  # SubjectAccessReview answers are cached
    kube_with_pods.api.faults.clear()

    kube_with_pods.add_pod("llm-inference-7d9f-c", namespace="ai-serving", labels={"app": "llm-inference"})
    assert wait_for(lambda: "llm-inference-7d9f-c" in names(client.as_hpa(PODS_PATH, LLM)))
    kube_with_pods.delete_pod("llm-inference-7d9f-a", namespace="ai-serving")
    assert wait_for(lambda: "llm-inference-7d9f-a" not in names(client.as_hpa(PODS_PATH, LLM)))


@pytest.mark.slow
def test_bearer_tokens_go_through_token_review(
    prom: PromEnv,
    pki: Pki,
    kube_with_pods: KubeDouble,
    tmp_path: Path,
    start_adapter: Callable[[ServeSettings], Adapter],
) -> None:
    kube_with_pods.add_token("hpa-token", HPA_SA, ["system:serviceaccounts"])
    kube_with_pods.allow("system:serviceaccounts", "get", "*", group="custom.metrics.k8s.io")
    kube_with_pods.allow(HPA_SA, path="/apis/*")
    adapter = start_adapter(kube_settings(prom, pki, kube_with_pods, tmp_path))
    client = Client(f"https://127.0.0.1:{adapter.port}", pki)
    assert wait_for(lambda: client.get("/readyz").status_code == 200)
    ok = client.get(PODS_PATH, headers={"Authorization": "Bearer hpa-token"}, params=LLM)
    assert ok.status_code == 200
    assert (
        client.get(
            "/apis/custom.metrics.k8s.io/v1beta2", headers={"Authorization": "Bearer hpa-token"}
        ).status_code
        == 200
    )
    bad = client.get(PODS_PATH, headers={"Authorization": "Bearer forged"}, params=LLM)
    assert bad.status_code == 401
    assert "not accepted by TokenReview" in bad.json()["message"]
    # the token is reviewed as the user; spoofed X-Remote-User next to it changes nothing
    spoof = client.get(
        PODS_PATH, headers={"Authorization": "Bearer forged", "X-Remote-User": HPA_SA}, params=LLM
    )
    assert spoof.status_code == 401


@pytest.mark.slow
def test_kubernetes_failure_is_503(
    prom: PromEnv,
    pki: Pki,
    kube_with_pods: KubeDouble,
    tmp_path: Path,
    start_adapter: Callable[[ServeSettings], Adapter],
) -> None:
    adapter = start_adapter(kube_settings(prom, pki, kube_with_pods, tmp_path))
    client = Client(f"https://127.0.0.1:{adapter.port}", pki)
    kube_with_pods.inject_fault(500, path_contains="subjectaccessreviews", count=5)
    r = client.as_hpa(PODS_PATH, LLM)
    assert r.status_code == 503
    assert r.json()["message"].startswith("SubjectAccessReview failed: HTTP 500")


@pytest.mark.slow
def test_request_header_ca_from_the_published_configmap(
    prom: PromEnv,
    pki: Pki,
    kube_with_pods: KubeDouble,
    tmp_path: Path,
    start_adapter: Callable[[ServeSettings], Adapter],
) -> None:
    kube_with_pods.add_configmap(
        "extension-apiserver-authentication",
        namespace="kube-system",
        data={
            "requestheader-client-ca-file": pki.front_proxy_ca.path.read_text(),
            "requestheader-allowed-names": '["front-proxy-client"]',
            "requestheader-username-headers": '["X-Remote-User"]',
            "client-ca-file": pki.client_ca.path.read_text(),
        },
    )
    kube_with_pods.allow(HPA_SA, "get", "*", group="custom.metrics.k8s.io")
    adapter = start_adapter(
        kube_settings(
            prom,
            pki,
            kube_with_pods,
            tmp_path,
            requestheader_client_ca_file=None,
            client_ca_file=None,
            requestheader_allowed_names=(),
        )
    )
    client = Client(f"https://127.0.0.1:{adapter.port}", pki)
    assert wait_for(lambda: client.get("/readyz").status_code == 200)
    assert client.as_hpa(PODS_PATH, LLM).status_code == 200
    wrong = client.get(
        PODS_PATH, cert=(pki.wrong_cn_proxy.cert, pki.wrong_cn_proxy.key), headers={"X-Remote-User": HPA_SA}
    )
    assert wrong.status_code == 401


@pytest.mark.slow
def test_explain_hpa_with_the_kubernetes_pod_source(
    prom: PromEnv, kube_with_pods: KubeDouble, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kube_with_pods.add_pod("llm-inference-7d9f-c", namespace="ai-serving", labels={"app": "llm-inference"})
    kube_with_pods.add_pod(
        "llm-inference-7d9f-new", namespace="ai-serving", labels={"app": "llm-inference"}, phase="Pending"
    )
    seed = Path(__file__).resolve().parents[3] / "examples" / "hpa-llm-inference.yaml"
    code = main(
        [
            "explain-hpa",
            "-f",
            str(seed),
            "--prometheus-url",
            prom.url,
            "--pod-source",
            "kubernetes",
            "--kubeconfig",
            str(kube_with_pods.write_kubeconfig(tmp_path / "kc")),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "4 pods, 3 ready" in out and "llm-inference-7d9f-new  pending" in out
    # queue: ready mean 12 → ratio 1.2 > 1 with one pending pod counted as 0: (36 + 0) / 4 = 9 → 0.9:
    # the direction flips, so the HPA keeps 4; utilisation 80 → inside tolerance: 4
    assert "FINAL: 4 → 4 replicas (no change)" in out


@pytest.mark.slow
def test_explain_hpa_cross_checks_the_hpa_status(
    prom: PromEnv, kube_with_pods: KubeDouble, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With a cluster at hand explain-hpa reads the HPA object's status: a scale 30 s ago that the
    Prometheus history (3 replicas throughout) does not show is reported as a caveat."""
    seed = Path(__file__).resolve().parents[3] / "examples" / "hpa-llm-inference.yaml"
    doc = next(d for d in yaml.safe_load_all(seed.read_text()) if d["kind"] == "HorizontalPodAutoscaler")
    last = time.time() - 30
    kube_with_pods.add_hpa(
        doc,
        status={
            "currentReplicas": 3,
            "desiredReplicas": 3,
            "lastScaleTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(last)),
        },
    )
    kubeconfig = str(kube_with_pods.write_kubeconfig(tmp_path / "kc"))
    args = ["explain-hpa", "-f", str(seed), "--prometheus-url", prom.url, "--kubeconfig", kubeconfig]
    code = main(args)
    out = capsys.readouterr().out
    assert code == 0, out
    assert "(the HPA's status: last scale 3" in out and "now 3 → desired 3)" in out
    assert "caveat: the HPA scaled 3" in out and "inside its 300s of policy periods" in out
    other = tmp_path / "other.yaml"
    other.write_text(seed.read_text().replace("name: llm-inference-hpa", "name: not-in-cluster"))
    code = main(["explain-hpa", "-f", str(other), "--prometheus-url", prom.url, "--kubeconfig", kubeconfig])
    out = capsys.readouterr().out
    assert code == 0
    assert "caveat: HPA ai-serving/not-in-cluster is not in the cluster" in out


@pytest.mark.slow
def test_explain_hpa_resource_metrics_from_metrics_server(
    prom: PromEnv, kube_with_pods: KubeDouble, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With a cluster at hand, Resource metrics come from metrics.k8s.io and requests from the pods'
    specs: 16 + 24 + 20 GiB used of 3 × 32 GiB requested = 62 % vs 50 % → ceil(1.24 × 3) = 4."""
    for name, gib in (("web-a", 16), ("web-b", 24), ("web-c", 20)):
        kube_with_pods.add_pod(name, namespace="shop", labels={"app": "web"}, resources={"memory": "32Gi"})
        kube_with_pods.add_pod_metrics(name, namespace="shop", usage={"memory": f"{gib}Gi"})
    hpa = tmp_path / "hpa.yaml"
    hpa.write_text(
        """apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: web, namespace: shop}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: web}
  minReplicas: 1
  maxReplicas: 10
  metrics:
    - type: Resource
      resource: {name: memory, target: {type: Utilization, averageUtilization: 50}}
"""
    )
    code = main(
        [
            "explain-hpa",
            "-f",
            str(hpa),
            "--prometheus-url",
            prom.url,
            "--selector",
            "app=web",
            "--kubeconfig",
            str(kube_with_pods.write_kubeconfig(tmp_path / "kc")),
            "--no-history",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    row = next(line for line in out.splitlines() if line.strip().startswith("resource/memory")).split()
    assert row[4] == "62%" and row[5] == "3/3" and row[6] == "4", out
    assert "pods from the Kubernetes API; Resource metrics from metrics.k8s.io" in out
    assert "FINAL: 3 → 4 replicas (scale up)" in out


@pytest.mark.slow
def test_pod_list_is_paginated_and_keeps_slim_shared_records(
    kube_with_pods: KubeDouble, tmp_path: Path
) -> None:
    for i in range(1_203):
        kube_with_pods.add_pod(
            f"batch-{i:04d}", namespace="jobs", labels={"app": "batch", "tier": "gpu"}, owner=None
        )
    client = KubeClient(kubeconfig=str(kube_with_pods.write_kubeconfig(tmp_path / "kc")), page_size=500)
    try:
        before = len(kube_with_pods.api.request_log)
        pods, version = client.list_pods()
    finally:
        client.close()
    lists = [p for m, p in kube_with_pods.api.request_log[before:] if m == "GET" and "/pods" in p]
    assert len(lists) == 3 and all("limit=500" in p for p in lists)
    assert "continue=" not in lists[0] and "continue=" in lists[1] and "continue=" in lists[2]
    assert len(pods) == 1_206 and len({(p.namespace, p.name) for p in pods}) == 1_206 and version
    batch = [p for p in pods if p.namespace == "jobs"]
    assert all(p.labels is batch[0].labels for p in batch)  # one mapping for 1,203 identical label sets
    assert dict(batch[0].labels) == {"app": "batch", "tier": "gpu"}
    assert not hasattr(batch[0], "__dict__")  # slotted: no per-pod dict


class _HtmlEverywhere:
    """A stand-in API server on 127.0.0.1 answering every request HTTP 200 with an HTML page (a
    misconfigured proxy or login portal), or with a truncated JSON object."""

    def __init__(self, body: bytes) -> None:
        import http.server  # noqa: PLC0415
        import threading  # noqa: PLC0415

        payload = body

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = _answer

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "c", "cluster": {"server": self.url}}],
                    "users": [{"name": "u", "user": {"token": "t"}}],
                    "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                    "current-context": "x",
                }
            )
        )
        return path

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("body", "said"),
    [(b"<html><body>Sign in</body></html>", "not JSON"), (b'{"items": [{"metadata"', "truncated")],
)
def test_every_call_maps_an_unreadable_answer_to_one_error(tmp_path: Path, body: bytes, said: str) -> None:
    from adapter.errors import KubernetesUnavailable  # noqa: PLC0415

    server = _HtmlEverywhere(body)
    try:
        kube_with_pods = KubeClient(kubeconfig=str(server.kubeconfig(tmp_path / "kubeconfig")), timeout=5)
        calls: dict[str, Callable[[], object]] = {
            "listing pods of ai-serving": lambda: kube_with_pods.pod_details("ai-serving"),
            "metrics.k8s.io pods of ai-serving": lambda: kube_with_pods.pod_usage("ai-serving"),
            "reading HPA ai-serving/llm": lambda: kube_with_pods.hpa_status("ai-serving", "llm"),
            "reading APIService v1beta1.custom.metrics.k8s.io": lambda: kube_with_pods.apiservices(
                ["v1beta1.custom.metrics.k8s.io"]
            ),
            "listing pods": kube_with_pods.list_pods,
            "extension-apiserver-authentication": kube_with_pods.authentication_configmap,
            "TokenReview": lambda: kube_with_pods.token_review("abc"),
        }
        for what, call in calls.items():
            with pytest.raises(KubernetesUnavailable) as caught:
                call()
            message = str(caught.value)
            assert what in message, message
            assert "\n" not in message
            if what != "TokenReview":  # the typed model path says only that it could not be read
                assert said in message, message
        kube_with_pods.close()
    finally:
        server.close()
