"""Numbers on the command line: the shared argparse types, and every service's flags refusing
NaN, infinities and out-of-range values with one line and exit status 2."""

from __future__ import annotations

import argparse
from collections.abc import Callable

import pytest

from adapter import cli as adapter_cli
from exporter.commands import cli as exporter_cli
from gpupilot_common import numbers, timefmt
from gpupilot_common.cli import OneLineParser
from rightsizer import cli as rightsizer_cli


def test_real_refuses_non_finite_and_out_of_range() -> None:
    parse = numbers.real(low=0, low_open=True, high=60, unit="seconds")
    assert parse("2.5") == 2.5
    assert parse("60") == 60
    for text, message in (
        ("nan", "'nan' is not a finite number"),
        ("-inf", "'-inf' is not a finite number"),
        ("0", "'0': must be more than 0 and at most 60 seconds"),
        ("60.001", "'60.001': must be more than 0 and at most 60 seconds"),
        ("1e300", "'1e300': must be more than 0"),
        ("five", "'five' is not a number"),
    ):
        with pytest.raises(argparse.ArgumentTypeError, match=f"^{message}"):
            parse(text)


def test_whole_and_long_text_is_not_echoed_whole() -> None:
    parse = numbers.whole(low=1, high=10)
    assert parse(" 7 ") == 7
    with pytest.raises(argparse.ArgumentTypeError, match="must be between 1 and 10"):
        parse("11")
    with pytest.raises(argparse.ArgumentTypeError, match="is not a whole number") as info:
        parse("9" * 5000)
    assert len(str(info.value)) < 120


def test_bounded_wraps_other_parsers_and_durations_read_as_durations() -> None:
    def seconds(text: str) -> float:
        if not text.endswith("s"):
            raise ValueError(f"{text!r} is not a duration")
        return float(text[:-1])

    parse = numbers.bounded(seconds, low=0, high=86400, show=timefmt.format_duration)
    assert parse("90s") == 90
    with pytest.raises(argparse.ArgumentTypeError, match=r"^'7x' is not a duration$"):
        parse("7x")
    with pytest.raises(argparse.ArgumentTypeError, match="must be between 0s and 1d"):
        parse("99999999999999999999s")
    with pytest.raises(argparse.ArgumentTypeError, match="is not a finite number"):
        parse("nans")


def test_one_line_parser_and_its_subparsers() -> None:
    p = OneLineParser(prog="tool")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("run").add_argument("--n", type=numbers.whole(low=1))
    with pytest.raises(SystemExit) as info:
        p.parse_args(["run", "--n", "0"])
    assert info.value.code == 2


CASES: list[tuple[Callable[[list[str]], int], list[str], str]] = [
    (exporter_cli.main, ["--interval", "nan"], "argument --interval: 'nan' is not a finite number"),
    (exporter_cli.main, ["--interval", "inf"], "argument --interval: 'inf' is not a finite number"),
    (exporter_cli.main, ["--interval", "1e300"], "argument --interval: '1e300': must be between"),
    (exporter_cli.main, ["backfill", "--scenario", "s", "--out", "o", "--days", "nan"], "--days: 'nan'"),
    (exporter_cli.main, ["backfill", "--scenario", "s", "--out", "o", "--jobs", "0"], "--jobs: '0'"),
    (
        adapter_cli.main,
        ["serve", "--prometheus-url", "http://p", "--config-check-interval", "0"],
        "argument --config-check-interval: '0' is zero",
    ),
    (
        adapter_cli.main,
        ["serve", "--prometheus-url", "http://p", "--prometheus-timeout", "nan"],
        "argument --prometheus-timeout: 'nan' is not a finite duration",
    ),
    (
        adapter_cli.main,
        ["serve", "--prometheus-url", "http://p", "--discovery-interval", "-5"],
        "argument --discovery-interval: '-5' is negative",
    ),
    (
        adapter_cli.main,
        ["serve", "--prometheus-url", "http://p", "--max-value-age", "inf"],
        "argument --max-value-age: 'inf' is not a finite duration",
    ),
    (
        adapter_cli.main,
        ["explain-hpa", "-f", "h.yaml", "--prometheus-url", "http://p", "--current-replicas", "-1"],
        "argument --current-replicas: '-1': must be between 0 and",
    ),
    (
        rightsizer_cli.main,
        ["plan", "--prometheus-url", "http://p", "--headroom", "nan"],
        "argument --headroom: 'nan' is not a finite number (must be between 0 and 4)",
    ),
    (
        rightsizer_cli.main,
        ["plan", "--prometheus-url", "http://p", "--headroom", "-0.9"],
        "argument --headroom: '-0.9': must be between 0 and 4",
    ),
    (
        rightsizer_cli.main,
        ["plan", "--prometheus-url", "http://p", "--window", "99999999999999999999d"],
        "argument --window: '99999999999999999999d' is longer than the maximum",
    ),
    (
        rightsizer_cli.main,
        ["plan", "--prometheus-url", "http://p", "--timeout", "0"],
        "argument --timeout: '0': must be more than 0 and at most 3600 seconds",
    ),
    (
        rightsizer_cli.main,
        ["plan", "--prometheus-url", "http://p", "--at", "nan"],
        "argument --at: 'nan' is not a time",
    ),
    (
        rightsizer_cli.main,
        ["report", "--prometheus-url", "http://p", "--out", "d", "--price-per-gpu-hour", "nan"],
        "argument --price-per-gpu-hour: 'nan' is not a finite number",
    ),
    (
        rightsizer_cli.main,
        ["report", "--prometheus-url", "http://p", "--out", "d", "--window", "1e30d"],
        "argument --window: '1e30d'",
    ),
    (
        rightsizer_cli.main,
        ["apply", "--plan", "p.json", "--timeout", "0"],
        "argument --timeout: '0' is zero; a duration here must be positive",
    ),
    (
        rightsizer_cli.main,
        ["apply", "--plan", "p.json", "--eviction-timeout", "9999999d"],
        "argument --eviction-timeout: '9999999d' is longer than the maximum",
    ),
]


@pytest.mark.parametrize(("main", "argv", "expected"), CASES, ids=[" ".join(c[1]) for c in CASES])
def test_every_cli_refuses_runaway_numbers_with_one_line(
    main: Callable[[list[str]], int], argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        rc = main(argv)
    except SystemExit as exc:
        rc = int(exc.code or 0)
    out, err = capsys.readouterr()
    assert rc == 2
    assert out == ""
    assert err.count("\n") == 1, err
    assert expected in err
    assert err.rstrip().endswith("(see --help)")
