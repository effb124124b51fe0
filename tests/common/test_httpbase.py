"""gpupilot_common.httpbase, the server under gpupilot_common.httpserve and the adapter's HTTPS
server: the one mapping of aiohttp's refusals, and a handler that raises."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Iterator

import pytest
from aiohttp import http_exceptions, web

from gpupilot_common.httpbase import LoopServer, refusal
from gpupilot_common.httpserve import Limits
from tests.support.common.httpclients import get


def test_a_line_at_the_url_limit_is_414_any_other_long_line_431() -> None:
    url = http_exceptions.LineTooLong(b"GET /aaaa...", 8192)
    header = http_exceptions.LineTooLong(b"X-Big: aaaa...", 1024)
    assert (
        refusal(400, url, None, max_url_bytes=8192).status,
        refusal(400, header, None, max_url_bytes=8192).status,
    ) == (
        414,
        431,
    )
    assert refusal(400, url, None, max_url_bytes=8192).reason == "RequestURITooLong"
    assert (
        refusal(400, header, None, max_url_bytes=8192).message == "a request header is longer than 1024 bytes"
    )


def test_too_many_headers_is_431() -> None:
    exc = http_exceptions.BadHttpMessage("Too many headers received")
    got = refusal(400, exc, None, max_url_bytes=8192)
    assert (got.status, got.reason) == (431, "RequestHeaderFieldsTooLarge")


def test_a_malformed_request_is_400_in_one_bounded_line() -> None:
    exc = http_exceptions.BadHttpMessage(
        "Invalid method encountered:\n\n    b'" + "\\x16" * 200 + "'\n     ^"
    )
    got = refusal(400, exc, None, max_url_bytes=8192)
    assert (got.status, got.reason) == (400, "BadRequest")
    assert got.message.startswith("malformed HTTP request: Invalid method encountered: b'\\x16")
    assert "\n" not in got.message and len(got.message) == 300


def test_other_statuses_pass_through() -> None:
    assert refusal(504, None, None, max_url_bytes=8192).status == 504
    assert refusal(500, ValueError("x"), None, max_url_bytes=8192).message == "internal error"


class _Raising(LoopServer[Limits]):
    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        raise ValueError("the handler broke")


@pytest.fixture
def raising() -> Iterator[_Raising]:
    srv = _Raising("127.0.0.1", 0, limits=Limits(), workers=1, name="raising", pool_name="raising").start()
    yield srv
    srv.close()


def test_a_raising_handler_is_a_500_and_one_error_line(
    raising: _Raising, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger="gpupilot_common.httpbase"):
        status, body = get(raising.port, "/x")
        assert get(raising.port, "/y")[0] == 500  # the server goes on
    assert status == 500 and body == b"internal error\n"
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.getMessage() for r in errors] == [
        "error serving /x: ValueError: the handler broke",
        "error serving /y: ValueError: the handler broke",
    ]
    assert not any(r.exc_info for r in caplog.records)


class _SlowToStop(_Raising):
    stop_wait_s = 0.2

    async def _cancel_connecting(self) -> None:
        await asyncio.sleep(2)  # an orderly stop slower than close() waits for (a loaded machine)


@pytest.mark.slow
def test_a_closed_server_leaves_no_task_behind(caplog: pytest.LogCaptureFixture) -> None:
    """Whether its orderly stop finishes or close() stops the loop before it has, the accept loop and
    every connection's task unwind before the loop is closed: a task destroyed while pending is an
    asyncio ERROR record in whichever test runs the next garbage collection."""
    with caplog.at_level(logging.DEBUG, logger="asyncio"):
        for kind in (_Raising, _SlowToStop):
            srv = kind("127.0.0.1", 0, limits=Limits(), workers=1, name="closing", pool_name="closing")
            srv.start()
            assert get(srv.port, "/x")[0] == 500
            srv.close()
            assert srv._loop.is_closed()
            del srv
            gc.collect()
    assert [
        r.getMessage() for r in caplog.records if r.name == "asyncio" and r.levelno >= logging.ERROR
    ] == []
