"""gpupilot_common.argtypes: the one set of argparse types, each refusing bad text in one line."""

from __future__ import annotations

import argparse

import pytest

from gpupilot_common import argtypes
from gpupilot_common.cli import OneLineParser


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (":9400", ("", 9400)),
        ("127.0.0.1:0", ("127.0.0.1", 0)),
        ("[::1]:9500", ("::1", 9500)),
        ("h:65535", ("h", 65535)),
    ],
)
def test_listen_address_reads_host_and_port_and_takes_port_zero(text: str, expected: tuple[str, int]) -> None:
    assert argtypes.listen_address(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "nowhere",
        "h:",
        "h:65536",
        "h:-1",
        "h:+80",
        "h:²",
        "h:８０",
        "h: 80",
        "h:123456",
        "[::1:80",
        "::1:80",
        "a b:80",
    ],
)
def test_listen_address_refuses_what_is_not_a_port(text: str) -> None:
    with pytest.raises(
        argparse.ArgumentTypeError, match=r"expected HOST:PORT, \[IPv6\]:PORT or :PORT with a port 0-65535"
    ):
        argtypes.listen_address(text)


def test_duration_bounds_and_zero() -> None:
    assert argtypes.duration()("1h30m") == 5400
    assert argtypes.duration(allow_zero=True)("0") == 0
    with pytest.raises(argparse.ArgumentTypeError, match="is zero"):
        argtypes.duration()("0s")
    with pytest.raises(argparse.ArgumentTypeError, match="longer than the maximum 1d"):
        argtypes.duration(maximum=86400)("2d")
    with pytest.raises(argparse.ArgumentTypeError, match="not a finite duration"):
        argtypes.duration()("inf")


def test_names_lists_and_times() -> None:
    assert argtypes.csv_list(" a, b,,c ") == ("a", "b", "c")
    assert argtypes.label_name("cluster") == "cluster"
    for bad in ("0bad", "__name__", "a-b", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="is not a Prometheus label name"):
            argtypes.label_name(bad)
    with pytest.raises(argparse.ArgumentTypeError, match="is not a cluster name"):
        argtypes.cluster_name("a\tb")
    owner = argtypes.namespaced_name(kind="SERVICE", example="ns/svc")
    assert owner("gpupilot/adapter") == ("gpupilot", "adapter")
    with pytest.raises(argparse.ArgumentTypeError, match=r"expected NAMESPACE/SERVICE, e\.g\. ns/svc"):
        owner("a/b/c")
    assert argtypes.moment("2026-11-01T00:00:00Z") == 1793491200
    with pytest.raises(argparse.ArgumentTypeError, match="is not a time"):
        argtypes.moment("yesterday")


def test_a_parser_error_is_one_line_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    parser = OneLineParser(prog="x")
    parser.add_argument("--listen", type=argtypes.listen_address)
    with pytest.raises(SystemExit) as info:
        parser.parse_args(["--listen", "a:b"])
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert (
        err
        == "x: error: argument --listen: 'a:b': expected HOST:PORT, [IPv6]:PORT or :PORT with a port 0-65535, e.g. :9400 or 127.0.0.1:9400 (see --help)\n"
    )
