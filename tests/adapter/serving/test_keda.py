"""KEDA's external scaler over real gRPC (a client built from the same externalscaler.proto) against
the adapter reading the real Prometheus of tests/adapter/conftest.py: metric spec, values, activity,
labelSelector, the same number as the external metrics API over HTTPS, errors for empty, stale and
unreachable, INVALID_ARGUMENT for bad metadata, TLS with a client CA, StreamIsActive pushing a
change, the gRPC self-metrics and the command-line flags."""

from __future__ import annotations

import argparse
import functools
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from prometheus_client import Gauge

from adapter.commands import serve
from adapter.config.settings import ScalerSettings, ServeSettings
from adapter.errors import ConfigError
from adapter.serving.app import Adapter
from adapter.serving.keda import externalscaler_pb2 as pb
from adapter.serving.keda import externalscaler_pb2_grpc as pb_grpc
from devkit.prometheus import free_port
from tests.adapter.conftest import Client, PromEnv, base_settings
from tests.support.adapter.pki import Pki, make_ca

EXT = "/apis/external.metrics.k8s.io/v1beta1"
CONFIG = """\
external:
  - name: gpupilot_fleet_waste_gpu_equivalents
    series: "gpupilot:fleet_waste:gpu_equivalents"
    query: sum(gpupilot:fleet_waste:gpu_equivalents{<<matchers>>})
  - name: inference_queue_depth_total
    series: inference_queue_depth
    namespaceLabel: namespace
    query: sum(inference_queue_depth{<<matchers>>})
  - name: gpu_utilization_sum
    series: DCGM_FI_DEV_GPU_UTIL
    namespaceLabel: namespace
    query: sum(DCGM_FI_DEV_GPU_UTIL{<<matchers>>})
  - name: keda_test_backlog
    series: keda_test_backlog
    query: sum(keda_test_backlog{<<matchers>>})
"""


@pytest.fixture
def scaler_adapter(
    prom: PromEnv, pki: Pki, start_adapter: Callable[[ServeSettings], Adapter], tmp_path: Path
) -> Adapter:
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    settings = base_settings(
        prom.url, pki, config_path=config, external_scaler=ScalerSettings(host="127.0.0.1", port=0)
    )
    return start_adapter(settings)


@pytest.fixture
def stub(scaler_adapter: Adapter) -> Iterator[pb_grpc.ExternalScalerStub]:
    assert scaler_adapter.scaler is not None
    with grpc.insecure_channel(f"127.0.0.1:{scaler_adapter.scaler.port}") as channel:
        yield pb_grpc.ExternalScalerStub(channel)


def ref(namespace: str = "ai-serving", **metadata: str) -> pb.ScaledObjectRef:
    return pb.ScaledObjectRef(name="consumer", namespace=namespace, scalerMetadata=metadata)


def metrics(stub: pb_grpc.ExternalScalerStub, r: pb.ScaledObjectRef) -> pb.MetricValue:
    answer = stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=r, metricName="s0-queue"), timeout=10)
    assert len(answer.metricValues) == 1
    value: pb.MetricValue = answer.metricValues[0]
    return value


def rpc_error(call: Callable[[], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


def test_metric_spec_values_and_activity(stub: pb_grpc.ExternalScalerStub) -> None:
    r = ref(metric="inference_queue_depth_total", targetValue="2.5", activationValue="35")
    spec = stub.GetMetricSpec(r, timeout=10).metricSpecs
    assert [(s.metricName, s.targetSizeFloat, s.targetSize) for s in spec] == [
        ("inference_queue_depth_total", 2.5, 2)
    ]
    value = metrics(stub, r)
    assert (value.metricName, value.metricValueFloat, value.metricValue) == ("s0-queue", 36.0, 36)
    assert stub.IsActive(r, timeout=10).result is True  # 36 > 35
    idle = ref(metric="inference_queue_depth_total", targetValue="2.5", activationValue="36")
    assert stub.IsActive(idle, timeout=10).result is False  # active only above the activation value
    default = ref(metric="gpupilot_fleet_waste_gpu_equivalents", targetValue="1")
    assert metrics(stub, default).metricValueFloat == 1.5
    assert stub.IsActive(default, timeout=10).result is True  # activationValue defaults to 0


def test_label_selector_and_the_same_number_as_the_external_api(
    stub: pb_grpc.ExternalScalerStub, scaler_adapter: Adapter, pki: Pki
) -> None:
    http = Client(f"https://127.0.0.1:{scaler_adapter.port}", pki)
    for selector, expected in (
        ("pod in (llm-inference-7d9f-a,llm-inference-7d9f-b)", 170.0),
        ("pod!=embedder-0,pod notin (batch-stale)", 240.0),
        ("", 270.0),  # batch-stale's value is older than --max-value-age: left out
    ):
        meta = {"metric": "gpu_utilization_sum", "targetValue": "50"}
        if selector:
            meta["labelSelector"] = selector
        grpc_value = metrics(stub, ref(**meta)).metricValueFloat
        body = http.as_hpa(
            f"{EXT}/namespaces/ai-serving/gpu_utilization_sum",
            {"labelSelector": selector} if selector else None,
        ).json()
        api_value = sum(float(item["value"]) for item in body["items"])
        assert grpc_value == api_value == expected, selector


def test_empty_stale_and_unknown_are_errors_never_zero(stub: pb_grpc.ExternalScalerStub) -> None:
    empty = ref("research", metric="inference_queue_depth_total", targetValue="1")
    for call in (lambda: metrics(stub, empty), lambda: stub.IsActive(empty, timeout=10)):
        err = rpc_error(call)
        assert err.code() == grpc.StatusCode.NOT_FOUND
        assert (
            "inference_queue_depth_total in namespace research has no value newer than 120s" in err.details()
        )
    stale = ref(metric="gpu_utilization_sum", labelSelector="pod=batch-stale", targetValue="1")
    err = rpc_error(lambda: metrics(stub, stale))
    assert err.code() == grpc.StatusCode.NOT_FOUND
    assert "with labelSelector pod=batch-stale has no value newer than 120s" in err.details()


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ({"targetValue": "1"}, "scalerMetadata.metric is required"),
        ({"metric": "nope", "targetValue": "1"}, "scalerMetadata.metric 'nope': not an external metric"),
        (  # a client's text is cut in the answer, whatever its length
            {"metric": "m" * 5000, "targetValue": "1"},
            "scalerMetadata.metric '" + "m" * 64 + "…': not an external metric",
        ),
        ({"metric": "gpu_utilization_sum"}, "scalerMetadata.targetValue is required"),
        (
            {"metric": "gpu_utilization_sum", "targetValue": "0"},
            "scalerMetadata.targetValue '0': must be greater than 0",
        ),
        (
            {"metric": "gpu_utilization_sum", "targetValue": "nan"},
            "scalerMetadata.targetValue 'nan': must be a finite",
        ),
        (
            {"metric": "gpu_utilization_sum", "targetValue": "ten"},
            "scalerMetadata.targetValue 'ten': not a number",
        ),
        (
            {"metric": "gpu_utilization_sum", "targetValue": "1", "activationValue": "inf"},
            "scalerMetadata.activationValue 'inf': must be a finite",
        ),
        (
            {"metric": "gpu_utilization_sum", "targetValue": "1", "labelSelector": "pod in ()"},
            "scalerMetadata.labelSelector: label selector 'pod in ()'",
        ),
    ],
)
def test_bad_metadata_is_invalid_argument(
    stub: pb_grpc.ExternalScalerStub, metadata: dict[str, str], message: str
) -> None:
    for call in (
        lambda: stub.GetMetricSpec(ref(**metadata), timeout=10),
        lambda: stub.IsActive(ref(**metadata), timeout=10),
        lambda: metrics(stub, ref(**metadata)),
    ):
        err = rpc_error(call)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert message in err.details() and "\n" not in err.details()


def test_prometheus_unreachable_is_unavailable(
    pki: Pki, start_adapter: Callable[[ServeSettings], Adapter]
) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    adapter = start_adapter(
        base_settings(
            closed, pki, refresh_interval=1.0, external_scaler=ScalerSettings(host="127.0.0.1", port=0)
        )
    )
    assert adapter.scaler is not None
    with grpc.insecure_channel(f"127.0.0.1:{adapter.scaler.port}") as channel:
        err = rpc_error(
            lambda: pb_grpc.ExternalScalerStub(channel).GetMetrics(
                pb.GetMetricsRequest(
                    scaledObjectRef=ref(metric="gpupilot_fleet_waste_gpu_equivalents", targetValue="1")
                ),
                timeout=10,
            )
        )
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    assert "127.0.0.1" in err.details()


@pytest.mark.slow
def test_stream_is_active_pushes_changes_and_ends_when_the_server_stops(
    prom: PromEnv, stub: pb_grpc.ExternalScalerStub, scaler_adapter: Adapter
) -> None:
    backlog = Gauge("keda_test_backlog", "test backlog", registry=prom.live.registry)
    try:
        backlog.set(0)
        r = ref(metric="keda_test_backlog", targetValue="10")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # the live target is scraped every second
            try:
                if metrics(stub, r).metricValueFloat == 0:
                    break
            except grpc.RpcError:
                pass
            time.sleep(0.3)
        stream = stub.StreamIsActive(r, timeout=30)
        seen: list[bool] = []
        first = threading.Event()

        def read() -> None:
            for answer in stream:
                seen.append(answer.result)
                first.set()

        reader = threading.Thread(target=read)
        reader.start()
        assert first.wait(10)
        assert seen == [False]  # the first value at once
        backlog.set(7)
        deadline = time.monotonic() + 15
        while seen == [False] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert seen == [False, True]  # pushed on change, and only then
        assert scaler_adapter.scaler is not None
        scaler_adapter.scaler.stop()
        reader.join(10)
        assert not reader.is_alive()
        assert stream.code() == grpc.StatusCode.OK  # ended cleanly by the server's stop
    finally:
        prom.live.registry.unregister(backlog)


def test_stream_ends_when_the_client_goes_away(
    stub: pb_grpc.ExternalScalerStub, scaler_adapter: Adapter, pki: Pki
) -> None:
    r = ref(metric="gpupilot_fleet_waste_gpu_equivalents", targetValue="1")
    stream = stub.StreamIsActive(r, timeout=30)
    assert next(stream).result is True
    stream.cancel()
    http = Client(f"https://127.0.0.1:{scaler_adapter.port}", pki)
    deadline = time.monotonic() + 10
    line = 'gpupilot_adapter_external_scaler_requests_total{code="CANCELLED",method="StreamIsActive"} 1.0'
    while line not in http.as_hpa("/metrics").text and time.monotonic() < deadline:
        time.sleep(0.1)
    text = http.as_hpa("/metrics").text
    assert line in text


def test_self_metrics_count_calls_by_method_and_code(
    stub: pb_grpc.ExternalScalerStub, scaler_adapter: Adapter, pki: Pki
) -> None:
    good = ref(metric="gpupilot_fleet_waste_gpu_equivalents", targetValue="1")
    for _ in range(3):
        metrics(stub, good)
    rpc_error(lambda: stub.IsActive(ref(metric="nope", targetValue="1"), timeout=10))
    text = Client(f"https://127.0.0.1:{scaler_adapter.port}", pki).as_hpa("/metrics").text
    assert 'gpupilot_adapter_external_scaler_requests_total{code="OK",method="GetMetrics"} 3.0' in text
    assert (
        'gpupilot_adapter_external_scaler_requests_total{code="INVALID_ARGUMENT",method="IsActive"} 1.0'
        in text
    )
    assert 'gpupilot_adapter_external_scaler_request_duration_seconds_count{method="GetMetrics"} 3.0' in text


def test_tls_with_client_ca(
    prom: PromEnv, pki: Pki, start_adapter: Callable[[ServeSettings], Adapter], tmp_path: Path
) -> None:
    settings = ScalerSettings(
        host="127.0.0.1",
        port=0,
        tls_cert_file=pki.server.cert,
        tls_key_file=pki.server.key,
        client_ca_file=pki.client_ca.path,
    )
    adapter = start_adapter(base_settings(prom.url, pki, external_scaler=settings))
    assert adapter.scaler is not None
    target = f"localhost:{adapter.scaler.port}"
    ca = pki.serving_ca.path.read_bytes()
    r = ref(metric="gpupilot_fleet_waste_gpu_equivalents", targetValue="1")

    def ask(creds: grpc.ChannelCredentials) -> float:
        with grpc.secure_channel(target, creds) as channel:
            return metrics(pb_grpc.ExternalScalerStub(channel), r).metricValueFloat

    alice = grpc.ssl_channel_credentials(
        root_certificates=ca,
        private_key=pki.alice.key.read_bytes(),
        certificate_chain=pki.alice.cert.read_bytes(),
    )
    assert ask(alice) == 1.5
    for creds in (
        grpc.ssl_channel_credentials(root_certificates=ca),  # no client certificate
        grpc.ssl_channel_credentials(
            root_certificates=ca,
            private_key=pki.rogue.key.read_bytes(),
            certificate_chain=pki.rogue.cert.read_bytes(),
        ),
    ):
        assert rpc_error(functools.partial(ask, creds)).code() == grpc.StatusCode.UNAVAILABLE
    with grpc.insecure_channel(target) as channel:  # plaintext to a TLS port
        err = rpc_error(lambda: metrics(pb_grpc.ExternalScalerStub(channel), r))
    assert err.code() == grpc.StatusCode.UNAVAILABLE


def _args(*extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    return parser.parse_args(["--prometheus-url", "http://127.0.0.1:9", *extra])


def test_flags() -> None:
    assert serve.serve_settings(_args()).external_scaler is None
    s = serve.serve_settings(_args("--external-scaler-address", ":9443")).external_scaler
    assert s is not None and (s.host, s.port, s.tls_cert_file) == ("0.0.0.0", 9443, None)
    s = serve.serve_settings(
        _args(
            "--external-scaler-address",
            "[::1]:9443",
            "--external-scaler-tls-cert-file",
            "c.pem",
            "--external-scaler-tls-key-file",
            "k.pem",
            "--external-scaler-client-ca-file",
            "ca.pem",
        )
    ).external_scaler
    assert s is not None and (s.host, s.client_ca_file) == ("::1", Path("ca.pem"))
    for argv, message in (
        (["--external-scaler-address", "9443"], "--external-scaler-address '9443': expected HOST:PORT"),
        (["--external-scaler-address", ":0"], r"a fixed port \(1-65535\)"),
        (["--external-scaler-address", "[::1:9443"], "expected HOST:PORT, [IPv6]:PORT"),
        (["--external-scaler-address", ":1", "--external-scaler-tls-cert-file", "c"], "go together"),
        (
            ["--external-scaler-address", ":1", "--external-scaler-client-ca-file", "c"],
            "needs --external-scaler-tls",
        ),
        (["--external-scaler-tls-cert-file", "c"], "need --external-scaler-address"),
    ):
        with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
            serve.serve_settings(_args(*argv))


def test_a_taken_port_and_unreadable_tls_files_are_one_line_errors(
    prom: PromEnv, pki: Pki, scaler_adapter: Adapter, tmp_path: Path
) -> None:
    assert scaler_adapter.scaler is not None
    taken = ScalerSettings(host="127.0.0.1", port=scaler_adapter.scaler.port)
    with pytest.raises(ConfigError, match=r"cannot listen on --external-scaler-address 127\.0\.0\.1:"):
        Adapter(base_settings(prom.url, pki, external_scaler=taken)).start()
    missing = replace(taken, port=0, tls_cert_file=tmp_path / "no.pem", tls_key_file=pki.server.key)
    with pytest.raises(ConfigError, match=r"--external-scaler-tls-cert-file .*no\.pem: cannot read"):
        Adapter(base_settings(prom.url, pki, external_scaler=missing))


def test_the_largest_target_fits_the_deprecated_integer_fields(stub: pb_grpc.ExternalScalerStub) -> None:
    spec = stub.GetMetricSpec(ref(metric="gpu_utilization_sum", targetValue="9.2e15"), timeout=10).metricSpecs
    assert (spec[0].targetSizeFloat, spec[0].targetSize) == (9.2e15, 9_200_000_000_000_000)
    assert (spec[0].metricName,) == ("gpu_utilization_sum",)


@pytest.mark.slow
def test_the_adapter_process_serves_the_scaler_from_its_flags(prom: PromEnv, tmp_path: Path) -> None:
    """``gpupilot-adapter serve --external-scaler-address`` as a process: answers, then exits 0 on SIGTERM."""
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    port = free_port()
    cmd = [
        *(sys.executable, "-m", "adapter", "serve", "--prometheus-url", prom.url, "--config", str(config)),
        *("--bind-address", "127.0.0.1", "--secure-port", str(free_port())),
        *("--self-signed-cert-dir", str(tmp_path / "tls"), "--authorization-mode", "none"),
        *("--pod-source", "none", "--refresh-interval", "1"),
        *("--external-scaler-address", f"127.0.0.1:{port}"),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            grpc.channel_ready_future(channel).result(timeout=30)
            stub = pb_grpc.ExternalScalerStub(channel)
            r = ref(metric="inference_queue_depth_total", targetValue="4")
            assert metrics(stub, r).metricValueFloat == 36.0
            assert stub.IsActive(r, timeout=10).result is True
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=20)
        assert proc.returncode == 0, stderr[-2000:]
        assert f"KEDA external scaler (gRPC, plaintext) on 127.0.0.1:{port}" in stderr
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_a_renewed_serving_certificate_is_used_for_new_connections(
    prom: PromEnv, pki: Pki, start_adapter: Callable[[ServeSettings], Adapter], tmp_path: Path
) -> None:
    cert, key = tmp_path / "serving.crt", tmp_path / "serving.key"
    shutil.copy(pki.server.cert, cert)
    shutil.copy(pki.server.key, key)
    settings = ScalerSettings(host="127.0.0.1", port=0, tls_cert_file=cert, tls_key_file=key)
    adapter = start_adapter(base_settings(prom.url, pki, external_scaler=settings))
    assert adapter.scaler is not None
    r = ref(metric="gpupilot_fleet_waste_gpu_equivalents", targetValue="1")

    def ask(ca: Path) -> float:
        creds = grpc.ssl_channel_credentials(root_certificates=ca.read_bytes())
        with grpc.secure_channel(f"localhost:{adapter.scaler.port}", creds) as channel:  # type: ignore[union-attr]
            return metrics(pb_grpc.ExternalScalerStub(channel), r).metricValueFloat

    assert ask(pki.serving_ca.path) == 1.5
    renewed_ca = make_ca(tmp_path / "renewed", "renewed-ca")
    renewed = renewed_ca.issue(tmp_path / "renewed", cn="gpupilot-adapter", server=True)
    key.write_bytes(renewed.key.read_bytes())  # as the kubelet swaps a Secret's files
    cert.write_bytes(renewed.cert.read_bytes())
    assert ask(renewed_ca.path) == 1.5  # a new connection's handshake re-reads the changed files
    assert rpc_error(lambda: ask(pki.serving_ca.path)).code() == grpc.StatusCode.UNAVAILABLE


def test_messages_over_64_kib_are_refused(stub: pb_grpc.ExternalScalerStub) -> None:
    big = ref(metric="gpu_utilization_sum", targetValue="1", labelSelector="pod in (" + "a," * 40_000 + "b)")
    err = rpc_error(lambda: stub.IsActive(big, timeout=10))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_a_scaler_tls_reload_that_raises_anything_keeps_the_previous_pair(
    pki: Pki, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """gRPC asks before each handshake: a reload failing in a way nobody foresaw (here a
    UnicodeDecodeError) must not fail the handshake: one line, counted, the previous pair kept."""
    from adapter.serving.keda.grpcserver import _TlsFiles  # noqa: PLC0415

    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes(pki.server.cert.read_bytes())
    key.write_bytes(pki.server.key.read_bytes())
    results: list[bool] = []
    failures: list[BaseException] = []
    tls = _TlsFiles(
        ScalerSettings(host="127.0.0.1", port=0, tls_cert_file=cert, tls_key_file=key), results.append
    )
    tls.on_failure = failures.append

    def odd() -> object:
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")

    tls._configuration = odd  # type: ignore[method-assign]
    cert.write_bytes(pki.server.cert.read_bytes() + b"\n")
    assert tls.fetch() is None
    assert results == [False] and [type(f) for f in failures] == [UnicodeDecodeError]
    assert any("UnicodeDecodeError" in r.getMessage() and "\n" not in r.getMessage() for r in caplog.records)
