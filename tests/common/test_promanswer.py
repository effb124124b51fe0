"""gpupilot_common.promanswer: each kind of answer becomes samples or one failure class with one
line saying what happened; the limits stop reading as soon as they are passed."""

from __future__ import annotations

import json

import pytest

from gpupilot_common import promanswer as pa

URL = "http://127.0.0.1:9090"
LIMITS = pa.AnswerLimits(max_series=3, max_bytes=4096)


def body(raw: bytes, *, limits: pa.AnswerLimits = LIMITS, chunk: int = 7) -> pa.AnswerBody:
    b = pa.AnswerBody(url=URL, query='sum by (pod) (rate(x{namespace="ml"}[5m]))', limits=limits)
    for i in range(0, len(raw), chunk):
        b.feed(raw[i : i + chunk])
    return b


def vector_json(values: list[str]) -> bytes:
    result = [{"metric": {"pod": f"p{i}"}, "value": [1700000000.5, v]} for i, v in enumerate(values)]
    return json.dumps(
        {"status": "success", "data": {"resultType": "vector", "result": result}}, separators=(",", ":")
    ).encode()


def test_a_vector_becomes_samples_with_every_value_as_given() -> None:
    b = body(vector_json(["1.5", "NaN", "+Inf"]))
    samples = pa.vector(pa.decode(200, "OK", b, path="/api/v1/query"), b)
    assert [s.labels["pod"] for s in samples] == ["p0", "p1", "p2"]
    assert samples[0] == pa.Sample({"pod": "p0"}, 1.5, 1700000000.5)
    assert str(samples[1].value) == "nan" and samples[2].value == float("inf")


def test_a_scalar_and_a_matrix() -> None:
    raw = b'{"status":"success","data":{"resultType":"scalar","result":[17.0,"4"]}}'
    assert pa.vector(pa.decode(200, "", body(raw), path="/q"), body(raw)) == [pa.Sample({}, 4.0, 17.0)]
    raw = b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{"a":"b"},"values":[[1,"2"],[2,"3"]]}]}}'
    b = body(raw)
    assert pa.matrix(pa.decode(200, "", b, path="/q"), b) == [pa.Series({"a": "b"}, [(1.0, 2.0), (2.0, 3.0)])]


def test_more_series_than_the_limit_stop_the_reading_and_name_query_and_flag() -> None:
    raw = vector_json(["1"] * 10)
    b = pa.AnswerBody(url=URL, query="up", limits=LIMITS)
    with pytest.raises(pa.PrometheusAnswerTooLarge) as err:
        for i in range(0, len(raw), 16):
            b.feed(raw[i : i + 16])
    assert b.size < len(raw)  # it stopped before the end of the answer
    assert str(err.value) == (
        f"Prometheus at {URL}: the answer to 'up' holds more than 3 series (--max-answer-series); "
        "narrow the query or raise the limit"
    )


def test_a_series_mark_split_between_chunks_is_still_counted() -> None:
    raw = vector_json(["1"] * 4)
    for chunk in (1, 2, 5, 9, 10, 11):
        with pytest.raises(pa.PrometheusAnswerTooLarge):
            body(raw, chunk=chunk)


def test_a_pretty_printed_answer_is_counted_after_parsing() -> None:
    raw = json.dumps(json.loads(vector_json(["1"] * 4)), indent=1).encode()  # "metric": { with spaces
    b = body(raw)
    with pytest.raises(pa.PrometheusAnswerTooLarge, match="more than 3 series"):
        pa.vector(pa.decode(200, "", b, path="/q"), b)


def test_more_bytes_than_the_limit() -> None:
    with pytest.raises(pa.PrometheusAnswerTooLarge, match=r"more than 4,096 bytes \(--max-answer-bytes\)"):
        body(b"x" * 5000)


def test_prometheus_own_error_text_also_on_http_200() -> None:
    raw = b'{"status":"error","errorType":"bad_data","error":"parse error: unexpected \\"}\\""}'
    for status in (200, 400, 422):
        with pytest.raises(pa.PrometheusQueryError) as err:
            pa.decode(status, "", body(raw), path="/api/v1/query")
        assert (
            str(err.value)
            == f'Prometheus at {URL} refused the query (bad_data: parse error: unexpected "}}")'
        )


def test_statuses_map_to_one_class_each() -> None:
    with pytest.raises(pa.PrometheusDenied, match=r"HTTP 403 for /api/v1/query \(no org id\)"):
        pa.decode(403, "Forbidden", body(b"no org id"), path="/api/v1/query")
    with pytest.raises(
        pa.PrometheusServerError, match=r"^Prometheus at .* answered HTTP 502 for /api/v1/query$"
    ):
        pa.decode(502, "Bad Gateway", body(b"<html>bad gateway</html>"), path="/api/v1/query")
    assert pa.PrometheusServerError.temporary and not pa.PrometheusQueryError.temporary


def test_truncated_json_is_called_truncated() -> None:
    raw = vector_json(["1", "2"])[:-9]
    with pytest.raises(pa.PrometheusBadAnswer) as err:
        pa.decode(200, "", body(raw), path="/api/v1/query")
    assert (
        str(err.value) == f"{URL}/api/v1/query: answer is not valid JSON (truncated after {len(raw)} bytes)"
    )


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            b"<html>Grafana</html>",
            " answered '<html>Grafana</h'…, not a Prometheus API body; is the URL right?",
        ),
        (b'{"data": 1}', " answered HTTP 200, not a Prometheus API body; is the URL right?"),
        (b"", " answered an empty body, not a Prometheus API body; is the URL right?"),
        (
            b'{"status": "success", "data": {"resultType": 5}} x',
            ": answer is not valid JSON (at byte 49 of 50)",
        ),
    ],
)
def test_not_the_api(raw: bytes, message: str) -> None:
    with pytest.raises(pa.PrometheusBadAnswer) as err:
        pa.decode(200, "", body(raw), path="/api/v1/query")
    assert str(err.value) == f"{URL}/api/v1/query{message}"


def test_a_malformed_sample_is_one_line() -> None:
    raw = b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"abc"]}]}}'
    b = body(raw)
    with pytest.raises(pa.PrometheusBadAnswer, match=r"malformed result \(could not convert string to float"):
        pa.vector(pa.decode(200, "", b, path="/q"), b)


def test_transport_messages_say_what_happened() -> None:
    assert str(pa.timed_out(URL, 5, flag="--timeout")) == (
        f"Prometheus at {URL}: no complete answer, timed out after 5 s (--timeout)"
    )
    assert str(pa.unreachable(URL, "connection refused", flag="--prometheus-url")) == (
        f"cannot reach Prometheus at {URL}: connection refused; is it running? check --prometheus-url"
    )
