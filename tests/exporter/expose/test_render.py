"""Pre-rendering families into text 0.0.4 / OpenMetrics 1.0 bytes (plain and gzip) and the per-scrape age line."""

from __future__ import annotations

import gzip
import zlib

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from exporter.expose.exposition import Family, device_families
from exporter.expose.render import AGE_NAME, format_value, render_openmetrics, render_page, render_text
from tests.support.exporter import fakes

COUNTER = Family(
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "counter",
    "Total energy consumption since boot (in mJ).",
    [((("gpu", "0"),), 123456789.0)],
)
TOTAL = Family("gpupilot_xid_errors_total", "counter", "Xid events.", [((("xid", "79"),), 2.0)])
GAUGE = Family("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", [((("gpu", "0"),), 41.5)])


def test_text_declares_dcgm_counters_as_counter_without_total() -> None:
    text = render_text([COUNTER, GAUGE])
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n" in text
    assert 'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="0"} 123456789\n' in text
    assert 'DCGM_FI_DEV_GPU_TEMP{gpu="0"} 41.5\n' in text


def test_openmetrics_declares_dcgm_counters_unknown_keeping_names() -> None:
    om = render_openmetrics([COUNTER, TOTAL, GAUGE]) + "# EOF\n"
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION unknown\n" in om
    assert "# TYPE gpupilot_xid_errors counter\n" in om
    assert 'gpupilot_xid_errors_total{xid="79"} 2\n' in om
    parsed = {f.name: f for f in parse_openmetrics(om)}  # the strict OpenMetrics parser accepts it
    assert parsed["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"].type == "unknown"
    assert (
        parsed["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"].samples[0].name
        == "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
    )
    assert parsed["gpupilot_xid_errors"].type == "counter"
    assert parsed["DCGM_FI_DEV_GPU_TEMP"].samples[0].value == 41.5


def test_label_values_and_help_are_escaped() -> None:
    odd = Family("x", "gauge", "line one\nback\\slash", [((("msg", 'say "hi"\\\nbye'),), 1.0)])
    text = render_text([odd])
    assert 'x{msg="say \\"hi\\"\\\\\\nbye"} 1\n' in text
    assert "# HELP x line one\\nback\\\\slash\n" in text
    sample = next(iter(parse_text(text))).samples[0]
    assert sample.labels["msg"] == 'say "hi"\\\nbye'
    om_sample = next(iter(parse_openmetrics(render_openmetrics([odd]) + "# EOF\n"))).samples[0]
    assert om_sample.labels["msg"] == 'say "hi"\\\nbye'


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (1.0, "1"),
        (0.25, "0.25"),
        (1e20, "1e+20"),
        (float("nan"), "NaN"),
        (float("inf"), "+Inf"),
        (-3.0, "-3"),
    ],
)
def test_values_print_as_plain_numbers(value: float, text: str) -> None:
    assert format_value(value) == text


def test_page_appends_age_per_scrape_and_eof_for_openmetrics() -> None:
    page = render_page([GAUGE], snapshot_at=100.0, age_labels=(("backend", "sim"),))
    first = page.body(openmetrics=False, gzip=False, now=101.5).decode()
    later = page.body(openmetrics=False, gzip=False, now=130.0).decode()
    assert f'{AGE_NAME}{{backend="sim"}} 1.500\n' in first
    assert f'{AGE_NAME}{{backend="sim"}} 30.000\n' in later
    assert "cached" in first.split(f"# HELP {AGE_NAME}")[1].splitlines()[0]
    om = page.body(openmetrics=True, gzip=False, now=101.5).decode()
    assert om.endswith("# EOF\n")
    assert {f.name for f in parse_openmetrics(om)} == {"DCGM_FI_DEV_GPU_TEMP", AGE_NAME}


def test_gzip_bodies_decompress_to_the_plain_bodies() -> None:
    fams = device_families(fakes.node(fakes.mig_gpu(0), fakes.whole_gpu(1)), hostname="n")
    page = render_page(fams, snapshot_at=10.0)
    for om in (False, True):
        plain = page.body(openmetrics=om, gzip=False, now=12.0)
        packed = page.body(openmetrics=om, gzip=True, now=12.0)
        assert gzip.decompress(packed) == plain
        assert len(packed) < len(plain) / 4
        # each body is exactly one gzip member (some clients read only the first)
        d = zlib.decompressobj(31)
        d.decompress(packed)
        assert d.eof and d.unused_data == b""


def test_no_age_line_before_the_first_snapshot() -> None:
    page = render_page([GAUGE], snapshot_at=None)
    assert AGE_NAME not in page.body(openmetrics=False, gzip=False, now=5.0).decode()
    assert page.body(openmetrics=True, gzip=False, now=5.0).decode().endswith("# EOF\n")


def test_full_snapshot_parses_in_both_formats_with_identical_samples() -> None:
    fams = device_families(
        fakes.node(fakes.with_xid(fakes.mig_gpu(0), 13), fakes.whole_gpu(1), lost=(fakes.lost(2),)),
        hostname="n",
    )
    page = render_page(fams, snapshot_at=1.0)
    text = page.body(openmetrics=False, gzip=False, now=2.0).decode()
    om = page.body(openmetrics=True, gzip=False, now=2.0).decode()

    def samples(families: object) -> set[tuple[str, tuple[tuple[str, str], ...], float]]:
        # prometheus_client's text parser appends _total to counters; compare names without it
        return {
            (s.name.removesuffix("_total"), tuple(sorted(s.labels.items())), s.value)
            for f in families  # type: ignore[attr-defined]
            for s in f.samples
        }

    assert samples(parse_text(text)) == samples(parse_openmetrics(om))
    assert len(samples(parse_text(text))) == sum(len(f.samples) for f in fams) + 1
