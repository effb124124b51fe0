"""Structure of the committed dashboards: uids, layout, titles, units, datasource variable, and that
the JSON is exactly what ``dashboards.build`` generates."""

from __future__ import annotations

from pathlib import Path

import pytest

from dashboards import build
from dashboards.model import Dashboard, Panel, Row, Target
from tests.dashboards import panels

FILES = panels.DASHBOARD_FILES
IDS = [p.name for p in FILES]


def test_the_six_dashboards_are_committed() -> None:
    assert {p.name for p in FILES} == set(build.DASHBOARDS)


def test_dashboard_uids_are_unique() -> None:
    uids = [panels.load(p)["uid"] for p in FILES]
    assert len(uids) == len(set(uids)) == len(FILES)


@pytest.mark.parametrize("path", FILES, ids=IDS)
def test_panel_ids_unique_and_titled(path: Path) -> None:
    all_panels = list(panels.panels(panels.load(path)))
    ids = [p["id"] for p in all_panels]
    assert len(ids) == len(set(ids))
    for p in all_panels:
        assert p.get("title", "").strip(), f"{path.name}: panel {p['id']} has no title"


@pytest.mark.parametrize("path", FILES, ids=IDS)
def test_every_panel_has_a_unit_and_the_datasource_variable(path: Path) -> None:
    for p in panels.panels(panels.load(path)):
        if p["type"] == "row":
            continue
        assert p["fieldConfig"]["defaults"].get("unit"), f"{path.name}: {p['title']} has no unit"
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"], f"{path.name}: {p['title']} has no query"
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}", p["title"]


@pytest.mark.parametrize("path", FILES, ids=IDS)
def test_datasource_is_a_prometheus_variable(path: Path) -> None:
    first = panels.load(path)["templating"]["list"][0]
    assert (first["name"], first["type"], first["query"]) == ("datasource", "datasource", "prometheus")
    for v in panels.variables(panels.load(path)):
        assert v["datasource"]["uid"] == "${datasource}"


def _cells(grid: dict[str, int]) -> set[tuple[int, int]]:
    return {
        (x, y)
        for x in range(grid["x"], grid["x"] + grid["w"])
        for y in range(grid["y"], grid["y"] + grid["h"])
    }


@pytest.mark.parametrize("path", FILES, ids=IDS)
def test_no_two_panels_overlap_and_all_fit_the_grid(path: Path) -> None:
    taken: dict[tuple[int, int], str] = {}
    for p in panels.panels(panels.load(path)):
        grid = p["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, p["title"]
        for cell in _cells(grid):
            assert cell not in taken, f"{path.name}: {p['title']!r} overlaps {taken[cell]!r} at {cell}"
            taken[cell] = p["title"]


def test_overlap_check_catches_an_overlap() -> None:
    assert _cells({"x": 0, "y": 0, "w": 12, "h": 8}) & _cells({"x": 11, "y": 7, "w": 4, "h": 4})


@pytest.mark.parametrize("name", sorted(build.DASHBOARDS))
def test_committed_json_is_the_builders_output(name: str) -> None:
    committed = (panels.REPO / "dashboards" / name).read_text(encoding="utf-8")
    assert committed == build.render(build.DASHBOARDS[name]), (
        f"dashboards/{name} is stale: run 'make dashboards'"
    )


def test_build_check_reports_a_stale_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert build.main(["--out", str(tmp_path)]) == 0
    assert build.main(["--out", str(tmp_path), "--check"]) == 0
    (tmp_path / "gpupilot-mig.json").write_text("{}")
    assert build.main(["--out", str(tmp_path), "--check"]) == 1
    assert "gpupilot-mig.json" in capsys.readouterr().err


def test_layout_wraps_rows_and_rejects_a_too_wide_panel() -> None:
    one = Panel("a", (Target("up"),), "none", width=16)
    d = Dashboard("u", "t", "d").add(one, one, Row("r"), one)
    grids = [p["gridPos"] for p in d.to_json()["panels"]]
    assert grids == [
        {"h": 8, "w": 16, "x": 0, "y": 0},
        {"h": 8, "w": 16, "x": 0, "y": 8},
        {"h": 1, "w": 24, "x": 0, "y": 16},
        {"h": 8, "w": 16, "x": 0, "y": 17},
    ]
    with pytest.raises(ValueError, match="width 30"):
        Dashboard("u", "t", "d").add(Panel("wide", (Target("up"),), "none", width=30)).to_json()


def test_dcgm_dashboard_panels_are_covered() -> None:
    titles = {
        p["title"] for p in panels.panels(panels.load(panels.REPO / "dashboards" / "gpupilot-node.json"))
    }
    for wanted in (
        "GPU temperature",
        "Power usage",
        "SM clocks",
        "GPU utilisation",
        "Tensor core activity",
        "DRAM activity",
        "Framebuffer memory used",
        "Energy used per interval",
        "PCIe throughput",
        "Xid errors by code",
        "MIG instances",
    ):
        assert wanted in titles
