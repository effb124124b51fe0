"""The checks of ``make e2e``, each returning one line (raising :class:`CheckFailed` with one line)."""

from __future__ import annotations

import base64
import json
import socket
import ssl
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from devkit.e2e.cluster import Cluster, InstallError
from devkit.e2e.pod import BUILDAH_NOISE, PodRun, run_once
from devkit.e2e.render import Rendering

HPA_USER = "system:serviceaccount:kube-system:horizontal-pod-autoscaler"
"""Who asks the metrics APIs in a cluster: the controller-manager's HPA controller, with its own
ServiceAccount (``--use-service-account-credentials``)."""
NAMESPACE = "ai-serving"
CUSTOM_METRIC = "DCGM_FI_DEV_GPU_UTIL"
EXTERNAL_METRIC = "inference_queue_depth_total"
NO_GPU = "backend nvml unavailable"


class CheckFailed(RuntimeError):
    pass


def retry(what: Callable[[], str], *, timeout: float, every: float = 1.0) -> str:
    """``what()``'s line once it stops failing, else its last failure (one line) after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return what()
        except (CheckFailed, OSError, ssl.SSLError, ValueError, KeyError) as err:
            if time.monotonic() > deadline:
                raise CheckFailed(str(err).splitlines()[0] if str(err) else type(err).__name__) from None
        time.sleep(every)


def get(url: str, *, ctx: ssl.SSLContext | None = None, token: str = "", timeout: float = 10) -> Any:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=timeout) as resp:
            body = resp.read()
    except urllib.error.HTTPError as err:
        detail = err.read().decode(errors="replace")[:300]
        raise CheckFailed(f"GET {url}: {err.code} {detail}") from None
    return json.loads(body) if body[:1] in (b"{", b"[") else body.decode(errors="replace")


def exporter_without_gpu(pod: PodRun, port: int) -> str:
    """The exporter image with the rendered command: live (/health), not ready (/ready), and the
    one line naming the missing NVML."""

    def probe() -> str:
        health = urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=3)
        health.close()
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=3).close()
            raise CheckFailed("/ready answered 200 without a GPU")
        except urllib.error.HTTPError as err:
            ready = err.code
        lines = [ln for ln in pod.output() if NO_GPU in ln]
        if not lines:
            raise CheckFailed(f"no '{NO_GPU}' line yet; last: {(pod.output() or [''])[-1][:160]}")
        message = lines[0].split(NO_GPU, 1)[1].split(";")[0].strip(": ")
        return f"/health 200, /ready {ready}, one line: '{NO_GPU}: {message}'"

    if not pod.running():
        raise CheckFailed(f"exited: {(pod.output() or ['no output'])[-1][:200]}")
    return retry(probe, timeout=60)


def _bundle_context(ca_bundle_b64: str, client: tuple[Path, Path] | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cadata=base64.b64decode(ca_bundle_b64).decode())
    if client is not None:
        ctx.load_cert_chain(str(client[0]), str(client[1]))
    return ctx


def serving_certificate(rendering: Rendering, port: int) -> str:
    """The adapter's served certificate verifies against each APIService's caBundle, for the name
    the aggregator dials."""
    names = []
    for api in rendering.of_kind("APIService"):
        bundle = api["spec"].get("caBundle")
        if not bundle:
            raise CheckFailed(f"APIService {api['metadata']['name']} carries no caBundle")
        svc = api["spec"]["service"]
        server_name = f"{svc['name']}.{svc['namespace']}.svc"

        def handshake(bundle: str = bundle, server_name: str = server_name) -> str:
            ctx = _bundle_context(bundle)
            with (
                socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
                ctx.wrap_socket(raw, server_hostname=server_name) as tls,
            ):
                return str(tls.version())

        version = retry(handshake, timeout=90)
        names.append(api["metadata"]["name"].split(".", 1)[0] + "." + api["spec"]["group"])
    return f"{len(names)} APIServices' caBundle verify the served certificate ({version}, {server_name})"


def _via_apiserver(cluster: Cluster, path: str) -> Any:
    """GET ``path`` from the real API server as the HPA controller (the admin's certificate,
    impersonating its ServiceAccount): through the aggregator for the metrics APIs."""
    try:
        out = cluster.kubectl("get", "--raw", path, f"--as={HPA_USER}", "--as-group=system:serviceaccounts",
                              "--as-group=system:serviceaccounts:kube-system", timeout=30)  # fmt: skip
    except InstallError as err:
        raise CheckFailed(str(err)) from None
    return json.loads(out)


def policies_type_check(cluster: Cluster, rendering: Rendering) -> str:
    """Every ValidatingAdmissionPolicy of the rendering compiled by the API server with no
    type-checking warning (status.typeChecking, against the real OpenAPI schemas)."""
    names = [p["metadata"]["name"] for p in rendering.of_kind("ValidatingAdmissionPolicy")]

    def ask() -> str:
        warnings = []
        for name in names:
            obj = cluster.kube.get("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy", name) or {}
            status = obj.get("status") or {}
            if "typeChecking" not in status:
                raise CheckFailed(f"ValidatingAdmissionPolicy {name}: not type-checked yet")
            for w in (status.get("typeChecking") or {}).get("expressionWarnings") or []:
                warnings.append(f"{name} {w.get('fieldRef')}: {str(w.get('warning')).splitlines()[0][:160]}")
        if warnings:
            raise CheckFailed(f"{len(warnings)} type-checking warnings: {warnings[0]}")
        return f"{len(names)} ValidatingAdmissionPolicies type-checked by kube-apiserver, no warning"

    return retry(ask, timeout=60, every=2)


def aggregated(cluster: Cluster, rendering: Rendering, port: int) -> str:
    """The APIServices through the real aggregator to the adapter on localhost:``port``: Available."""
    names = cluster.aggregate(rendering, port)
    return f"{len(names)} APIServices Available through kube-apiserver's aggregator: {', '.join(names)}"


def no_refusals(cluster: Cluster, namespace: str) -> str:
    """No request of the rendering's ServiceAccounts was refused (403) by the API server."""
    refused = cluster.refused(user_prefix=f"system:serviceaccount:{namespace}:")
    if refused:
        raise CheckFailed(f"{len(refused)} refused: {'; '.join(refused[:3])}")
    users = cluster.audited_users(f"system:serviceaccount:{namespace}:")
    return f"no 403 in the audit log for {', '.join(sorted(users)) or 'no ServiceAccount of the release'}"


def custom_metrics(cluster: Cluster) -> str:
    def ask() -> str:
        found = _via_apiserver(cluster, "/apis/custom.metrics.k8s.io/v1beta2")
        metrics = len(found.get("resources", []))
        path = f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{NAMESPACE}/pods/*/{CUSTOM_METRIC}"
        items = _via_apiserver(cluster, path).get("items", [])
        if not items:
            raise CheckFailed(f"{path}: no items")
        values = ", ".join(f"{i['describedObject']['name']}={i['value']}" for i in items[:3])
        return f"discovery {metrics} resources; {CUSTOM_METRIC} of {len(items)} pods in {NAMESPACE}: {values}"

    return retry(ask, timeout=90, every=2)


def external_metrics(cluster: Cluster) -> str:
    def ask() -> str:
        path = f"/apis/external.metrics.k8s.io/v1beta1/namespaces/{NAMESPACE}/{EXTERNAL_METRIC}"
        items = _via_apiserver(cluster, path).get("items", [])
        if not items:
            raise CheckFailed(f"{path}: no items")
        return f"{EXTERNAL_METRIC} in {NAMESPACE}: {items[0]['value']}"

    return retry(ask, timeout=60, every=2)


KEDA_CLIENT = """
import sys, grpc
from adapter.serving.keda import externalscaler_pb2 as pb, externalscaler_pb2_grpc as rpc
ref = pb.ScaledObjectRef(name="e2e", namespace=sys.argv[2], scalerMetadata={"metric": sys.argv[3], "targetValue": "10"})
with grpc.insecure_channel(sys.argv[1]) as channel:
    answer = rpc.ExternalScalerStub(channel).GetMetrics(pb.GetMetricsRequest(scaledObjectRef=ref, metricName=sys.argv[3]), timeout=20)
print(" ".join(f"{m.metricName}={m.metricValueFloat:g}" for m in answer.metricValues))
"""


def keda_get_metrics(adapter: PodRun, port: int) -> str:
    """KEDA's GetMetrics to the scaler's port, from a client in the adapter's image (its gRPC stubs)."""

    def ask() -> str:
        res = run_once(
            adapter.workload,
            "python3",
            "-c",
            KEDA_CLIENT,
            f"127.0.0.1:{port}",
            NAMESPACE,
            EXTERNAL_METRIC,
            timeout=60,
        )
        lines = [
            ln
            for ln in (res.stdout + res.stderr).splitlines()
            if ln.strip() and not ln.startswith(BUILDAH_NOISE)
        ]
        if res.returncode != 0 or not lines:
            raise CheckFailed(f"GetMetrics: exit {res.returncode}: {(lines or ['no output'])[-1][:200]}")
        return f"GetMetrics answered {lines[-1]}"

    return retry(ask, timeout=60, every=3)


def rightsizer_serves(port: int, timeout: float) -> str:
    def ask() -> str:
        plan = get(f"http://127.0.0.1:{port}/plan.json", timeout=10)
        report = get(f"http://127.0.0.1:{port}/report/", timeout=10)
        if not isinstance(plan, dict):
            raise CheckFailed("/plan.json is not a JSON document")
        if "no report yet" in str(report):
            raise CheckFailed("/report/ says: no report yet")
        keys = ", ".join(sorted(plan)[:4])
        return f"/plan.json ({keys}, ...) and /report/ ({len(str(report))} bytes) served"

    return retry(ask, timeout=timeout, every=3)


def helm_test(pod: PodRun, timeout: float) -> str:
    code = pod.wait(timeout)
    lines = pod.output()
    if code is None:
        raise CheckFailed(f"still running after {timeout:.0f}s")
    if code != 0:
        raise CheckFailed(f"exit {code}: {(lines or ['no output'])[-1][:200]}")
    oks = [ln.strip() for ln in lines if ln.startswith("OK")]
    return f"exit 0: {'; '.join(oks)}"


def scratch() -> Path:
    return Path(tempfile.mkdtemp(prefix="gpupilot-e2e-"))
