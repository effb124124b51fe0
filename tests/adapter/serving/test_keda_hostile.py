"""KEDA's external scaler under hostile inputs, over real gRPC against the adapter and the real
Prometheus of tests/adapter/conftest.py: a sum with a NaN, ±Inf or out-of-bound member, or a sum out
of bound, is UNAVAILABLE naming the series (never the sum of the rest with status OK); targetValue
and activationValue read as KEDA (Go's strconv.ParseFloat) reads them and range-checked; the
``…FromEnv`` keys KEDA resolves; PEM material in scalerMetadata refused without being echoed or
logged; 500 StreamIsActive streams on one connection with GetMetrics answered beside them; the
stream limit answered RESOURCE_EXHAUSTED at once; first evaluations bounded by
--prometheus-timeout however many are queued."""

from __future__ import annotations

import concurrent.futures
import logging
import shutil
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from adapter.config.settings import ScalerSettings, ServeSettings
from adapter.serving.app import Adapter
from adapter.serving.keda import externalscaler_pb2 as pb
from adapter.serving.keda import externalscaler_pb2_grpc as pb_grpc
from tests.adapter.conftest import PromEnv, base_settings
from tests.support.adapter.pki import Pki, make_ca


def _member(value: str, name: str) -> str:
    return f'label_replace(vector({value}), "series", "{name}", "", "")'


def _rule(name: str, *members: tuple[str, str]) -> str:
    query = " or ".join(_member(v, n) for v, n in members)
    return f"  - name: {name}\n    series: up\n    query: '{query}'\n"


CONFIG = (
    "external:\n"
    + _rule("ok_sum", ("2", "a"), ("3", "b"))
    + _rule("nan_and_5", ("NaN", "bad"), ("5", "good"))
    + _rule("huge_and_5", ("1e308", "bad"), ("5", "good"))
    + _rule("inf_alone", ("+Inf", "bad"))
    + _rule("nan_alone", ("NaN", "bad"))
    + _rule("two_of_9e15", ("9e15", "a"), ("9e15", "b"))
    + "  - name: plain\n    series: up\n    query: sum(up{<<matchers>>})\n"
    + "  - name: utilisation\n    series: up\n    valueRange: [0, 100]\n"
    + f"    query: '{_member('140', 'broken')} or {_member('20', 'fine')}'\n"
)


@pytest.fixture
def adapter(
    prom: PromEnv, pki: Pki, start_adapter: Callable[[ServeSettings], Adapter], tmp_path: Path
) -> Adapter:
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    scaler = ScalerSettings(host="127.0.0.1", port=0, max_streams=600)
    return start_adapter(base_settings(prom.url, pki, config_path=config, external_scaler=scaler))


@pytest.fixture
def channel(adapter: Adapter) -> Iterator[grpc.Channel]:
    assert adapter.scaler is not None
    with grpc.insecure_channel(f"127.0.0.1:{adapter.scaler.port}") as ch:
        yield ch


def ref(**metadata: str) -> pb.ScaledObjectRef:
    return pb.ScaledObjectRef(name="consumer", namespace="ai-serving", scalerMetadata=metadata)


def get_metrics(stub: pb_grpc.ExternalScalerStub, r: pb.ScaledObjectRef, timeout: float = 10) -> float:
    answer = stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=r, metricName="m"), timeout=timeout)
    return float(answer.metricValues[0].metricValueFloat)


def rpc_error(call: Callable[[], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


@pytest.mark.parametrize(
    ("metric", "detail"),
    [
        ("nan_and_5", 'series {series="bad"} is nan, not a number KEDA can scale on'),
        ("huge_and_5", 'series {series="bad"} is 1e+308, beyond ±9.2e15'),
        ("inf_alone", 'series {series="bad"} is inf, not a number KEDA can scale on'),
        ("nan_alone", 'series {series="bad"} is nan'),
        ("two_of_9e15", "the sum of 2 series is 1.8e+16, beyond ±9.2e15"),
        ("utilisation", 'series {series="broken"} is 140, outside the metric\'s valueRange [0, 100]'),
    ],
)
def test_a_sum_with_a_bad_member_is_unavailable_naming_it(
    channel: grpc.Channel, metric: str, detail: str
) -> None:
    stub = pb_grpc.ExternalScalerStub(channel)
    r = ref(metric=metric, targetValue="1")
    for call in (lambda: get_metrics(stub, r), lambda: stub.IsActive(r, timeout=10)):
        err = rpc_error(call)
        assert err.code() == grpc.StatusCode.UNAVAILABLE, err.details()
        assert f"external metric {metric} in namespace ai-serving: {detail}" in err.details()


def test_a_sum_of_good_members_is_served(channel: grpc.Channel) -> None:
    assert get_metrics(pb_grpc.ExternalScalerStub(channel), ref(metric="ok_sum", targetValue="1")) == 5.0


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ({"targetValue": "0.0004"}, "targetValue '0.0004': must be at least 0.001"),
        ({"targetValue": "1e308"}, "targetValue '1e308': must be at most 9.2e15 in magnitude"),
        ({"targetValue": "1e16"}, "targetValue '1e16': must be at most 9.2e15"),
        ({"targetValue": "1_000"}, "targetValue '1_000': not a number as KEDA reads it"),
        ({"targetValue": "\u0661\u0660"}, "not a number as KEDA reads it"),  # Arabic-Indic 10
        ({"targetValue": " 5"}, "targetValue ' 5': not a number as KEDA reads it"),
        ({"targetValue": "-Infinity"}, "targetValue '-Infinity': must be a finite number"),
        ({"targetValue": "-2"}, "targetValue '-2': must be greater than 0"),
        ({"targetValue": "1", "activationValue": "-1e17"}, "activationValue '-1e17': must be at most 9.2e15"),
        ({"targetValue": "1", "targetValueFromEnv": "2"}, "give targetValue or targetValueFromEnv, not both"),
        ({"targetValueFromEnv": "0"}, "targetValueFromEnv '0': must be greater than 0"),
    ],
)
def test_numbers_are_read_as_keda_reads_them(
    channel: grpc.Channel, metadata: dict[str, str], message: str
) -> None:
    stub = pb_grpc.ExternalScalerStub(channel)
    err = rpc_error(lambda: stub.GetMetricSpec(ref(metric="ok_sum", **metadata), timeout=10))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"scalerMetadata.{message}" in err.details() or message in err.details(), err.details()


@pytest.mark.parametrize(
    ("metadata", "target", "activation"),
    [
        ({"targetValue": "0.001"}, 0.001, 0.0),
        ({"targetValue": "2.5e3", "activationValue": "-4"}, 2500.0, -4.0),
        ({"targetValue": "0x1p4"}, 16.0, 0.0),  # Go reads hexadecimal floats, underscores allowed there
        ({"targetValue": "0x1_0p0"}, 16.0, 0.0),
        ({"targetValueFromEnv": "2.5", "activationValueFromEnv": "3"}, 2.5, 3.0),  # as KEDA resolves them
        ({"targetValue": "9e15"}, 9e15, 0.0),
    ],
)
def test_good_numbers_and_from_env_keys(
    channel: grpc.Channel, metadata: dict[str, str], target: float, activation: float
) -> None:
    stub = pb_grpc.ExternalScalerStub(channel)
    spec = stub.GetMetricSpec(ref(metric="ok_sum", **metadata), timeout=10).metricSpecs[0]
    assert (spec.targetSizeFloat, spec.targetSize) == (target, int(target))
    assert stub.IsActive(ref(metric="ok_sum", **metadata), timeout=10).result is (activation < 5.0)


def test_metric_and_selector_from_env(channel: grpc.Channel) -> None:
    stub = pb_grpc.ExternalScalerStub(channel)
    assert get_metrics(stub, ref(metricFromEnv="ok_sum", targetValue="1")) == 5.0
    bad = ref(metric="ok_sum", labelSelectorFromEnv="pod in ()", targetValue="1")
    err = rpc_error(lambda: get_metrics(stub, bad))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "scalerMetadata.labelSelectorFromEnv: label selector 'pod in ()'" in err.details()


PEM = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7SECRET\n-----END PRIVATE KEY-----\n"


@pytest.mark.parametrize(
    ("key", "value"),
    [("tlsClientKey", PEM), ("caCert", "not even PEM"), ("tlsClientCert", PEM), ("notes", "x " + PEM)],
)
def test_pem_material_in_scaler_metadata_is_refused_never_echoed(
    channel: grpc.Channel, caplog: pytest.LogCaptureFixture, key: str, value: str
) -> None:
    stub = pb_grpc.ExternalScalerStub(channel)
    r = ref(metric="ok_sum", targetValue="1", **{key: value})
    caplog.set_level(logging.DEBUG)
    for call in (
        lambda: stub.GetMetricSpec(r, timeout=10),
        lambda: get_metrics(stub, r),
        lambda: stub.IsActive(r, timeout=10),
    ):
        err = rpc_error(call)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        details = err.details()
        assert f"scalerMetadata.{key} holds TLS material" in details and "TriggerAuthentication" in details
        assert "SECRET" not in details and "even" not in details and "\n" not in details
    assert "SECRET" not in caplog.text and "not even PEM" not in caplog.text


@pytest.mark.slow
def test_500_streams_and_unary_calls_share_one_connection(channel: grpc.Channel, adapter: Adapter) -> None:
    stub = pb_grpc.ExternalScalerStub(channel)
    streams = [stub.StreamIsActive(ref(metric="ok_sum", targetValue="1"), timeout=120) for _ in range(500)]
    try:
        start = time.monotonic()
        firsts = [next(s).result for s in streams]  # each stream gets its first message
        assert firsts == [True] * 500
        assert adapter.scaler is not None and adapter.scaler.servicer is not None
        assert adapter.scaler.servicer.streams == 500
        # with 500 streams open on this connection, unary calls are answered at once
        for _ in range(5):
            t = time.monotonic()
            assert get_metrics(stub, ref(metric="ok_sum", targetValue="1"), timeout=5) == 5.0
            assert time.monotonic() - t < 1.0
        assert time.monotonic() - start < 30
    finally:
        for s in streams:
            s.cancel()


def test_past_the_stream_limit_resource_exhausted_at_once(
    prom: PromEnv, pki: Pki, start_adapter: Callable[[ServeSettings], Adapter], tmp_path: Path
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    scaler = ScalerSettings(host="127.0.0.1", port=0, max_streams=5)
    adapter = start_adapter(base_settings(prom.url, pki, config_path=config, external_scaler=scaler))
    assert adapter.scaler is not None
    with grpc.insecure_channel(f"127.0.0.1:{adapter.scaler.port}") as ch:
        stub = pb_grpc.ExternalScalerStub(ch)
        r = ref(metric="ok_sum", targetValue="1")
        streams = [stub.StreamIsActive(r, timeout=60) for _ in range(5)]
        try:
            assert [next(s).result for s in streams] == [True] * 5
            t = time.monotonic()
            err = rpc_error(lambda: next(stub.StreamIsActive(r, timeout=10)))
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "5 StreamIsActive streams are open at the external scaler, its limit" in err.details()
            assert time.monotonic() - t < 1.0
            assert get_metrics(stub, r) == 5.0  # unary calls are not counted against streams
        finally:
            for s in streams:
                s.cancel()


@pytest.mark.slow
def test_first_evaluations_end_within_the_prometheus_timeout_however_many_are_queued(
    pki: Pki, start_adapter: Callable[[ServeSettings], Adapter], tmp_path: Path
) -> None:
    """A Prometheus that accepts connections and never answers; 40 new triggers at once."""
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    with socket.socket() as hanging:
        hanging.bind(("127.0.0.1", 0))
        hanging.listen(200)
        url = f"http://127.0.0.1:{hanging.getsockname()[1]}"
        settings = base_settings(
            url, pki, config_path=config, refresh_interval=60.0,
            external_scaler=ScalerSettings(host="127.0.0.1", port=0),
        )  # fmt: skip
        settings = replace(settings, prometheus=replace(settings.prometheus, timeout=1.0))
        adapter = start_adapter(settings)
        assert adapter.scaler is not None
        with grpc.insecure_channel(f"127.0.0.1:{adapter.scaler.port}") as ch:
            stub = pb_grpc.ExternalScalerStub(ch)

            def ask(i: int) -> tuple[grpc.StatusCode, float]:
                t = time.monotonic()
                r = ref(metric="plain", targetValue="1", labelSelector=f"job=j{i}")  # 40 distinct queries
                try:
                    get_metrics(stub, r, timeout=30)
                except grpc.RpcError as exc:
                    return exc.code(), time.monotonic() - t
                return grpc.StatusCode.OK, time.monotonic() - t

            with concurrent.futures.ThreadPoolExecutor(40) as pool:
                results = list(pool.map(ask, range(40)))
    assert {code for code, _ in results} == {grpc.StatusCode.UNAVAILABLE}
    slowest = max(took for _, took in results)
    assert slowest < 2.0, f"the slowest first evaluation took {slowest:.1f}s with a 1s --prometheus-timeout"


@pytest.mark.slow
def test_a_garbage_certificate_is_a_failed_reload_and_the_previous_one_stays(
    prom: PromEnv,
    pki: Pki,
    start_adapter: Callable[[ServeSettings], Adapter],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    cert, key = tmp_path / "serving.crt", tmp_path / "serving.key"
    shutil.copy(pki.server.cert, cert)
    shutil.copy(pki.server.key, key)
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    scaler = ScalerSettings(host="127.0.0.1", port=0, tls_cert_file=cert, tls_key_file=key)
    adapter = start_adapter(base_settings(prom.url, pki, config_path=config, external_scaler=scaler))
    assert adapter.scaler is not None
    r = ref(metric="ok_sum", targetValue="1")

    def ask(ca: Path) -> float:
        creds = grpc.ssl_channel_credentials(root_certificates=ca.read_bytes())
        with grpc.secure_channel(f"localhost:{adapter.scaler.port}", creds) as ch:  # type: ignore[union-attr]
            return get_metrics(pb_grpc.ExternalScalerStub(ch), r)

    def reloads(result: str) -> float:
        value = adapter.metrics.registry.get_sample_value(
            "gpupilot_adapter_external_scaler_tls_reloads_total", {"result": result}
        )
        return value or 0.0

    assert ask(pki.serving_ca.path) == 5.0
    caplog.set_level(logging.INFO, logger="adapter.serving.keda.grpcserver")
    cert.write_text("-----BEGIN CERTIFICATE-----\ngarbage\n-----END CERTIFICATE-----\n")
    for _ in range(3):  # several handshakes: one failed reload, one line
        assert ask(pki.serving_ca.path) == 5.0  # the previous certificate is still served
    assert (reloads("failure"), reloads("success")) == (1.0, 0.0)
    lines = [rec for rec in caplog.records if "serving certificate" in rec.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.ERROR
    assert "reloading the serving certificate and client CA failed" in lines[0].getMessage()
    assert "reloaded" not in lines[0].getMessage()
    renewed_ca = make_ca(tmp_path / "renewed", "renewed-ca")
    renewed = renewed_ca.issue(tmp_path / "renewed", cn="gpupilot-adapter", server=True)
    key.write_bytes(renewed.key.read_bytes())
    cert.write_bytes(renewed.cert.read_bytes())
    assert ask(renewed_ca.path) == 5.0
    assert reloads("success") >= 1.0
