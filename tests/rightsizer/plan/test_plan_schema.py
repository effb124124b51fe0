"""plan.json schema: round trip, stable names and ids, one-line errors for bad files."""

from __future__ import annotations

import errno
import json
import os
from dataclasses import replace
from pathlib import Path

import orjson
import pytest

from gpupilot_common import atomicfile
from rightsizer.plan import codec
from rightsizer.plan import model as planmod
from rightsizer.plan.model import (
    DisruptedPod,
    Evidence,
    GpuLayout,
    HeldDevice,
    NodePlan,
    Plan,
    PlanError,
    SolverInfo,
    Totals,
    Window,
)


def sample_plan() -> Plan:
    entries = [{"devices": [0], "mig-enabled": True, "mig-devices": {"3g.40gb": 1, "4g.40gb": 1}}]
    name = planmod.config_name_for(entries)
    node = NodePlan(
        name="gpu-node-1",
        model="H100 80GB",
        pci_device_id="0x2330",
        mig_strategy="mixed",
        changed=True,
        current_config_name="all-balanced",
        current=(GpuLayout(0, True, {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}),),
        proposed=(GpuLayout(0, True, {"3g.40gb": 1, "4g.40gb": 1}),),
        config_name=name,
        config_document={"version": "v1", "mig-configs": {name: entries}},
        slices_freed=0,
        gpus_freed=0,
        expected_utilisation=0.5,
        current_utilisation=0.25,
        pods_disrupted=(DisruptedPod("ml", "infer-0", (HeldDevice(0, "3g.40gb", "1", "MIG-x"),)),),
        evidence=(
            Evidence(
                gpu=0,
                profile="1g.10gb",
                gpu_instance_id="7",
                allocated=False,
                idle_hours=168.0,
                p95_activity=None,
                coverage_hours=0.0,
                window_hours=168.0,
            ),
        ),
    )
    window = Window("2026-11-22T00:00:00Z", "2026-11-29T00:00:00Z", "7d")
    return Plan(
        plan_id=planmod.plan_id_for(nodes=[node], window=window),
        created_at="2026-11-29T00:00:00Z",
        window=window,
        prometheus_url="http://127.0.0.1:9090",
        settings={"max_nodes": 3, "allow_moves": False},
        solver=SolverInfo("milp", "optimal", 1, 0.1),
        totals=Totals(
            nodes=1, nodes_changed=1, gpus=1, gpus_needed=1, gpus_freed=0, slices_freed=0, pods_disrupted=1
        ),
        mig_parted_config=node.config_document,
        nodes=(node,),
    )


def test_round_trip_preserves_everything(tmp_path: Path) -> None:
    plan = sample_plan()
    path = tmp_path / "plan.json"
    planmod.dump_plan(plan, path)
    loaded = planmod.load_plan(path)
    assert loaded == plan
    data = json.loads(path.read_text())
    assert data["schema"] == "gpupilot.plan/v1"
    assert data["nodes"][0]["evidence"][0]["p95_activity"] is None
    assert loaded.node("gpu-node-1") is not None
    assert loaded.changed_nodes[0].config_name.startswith("gpupilot-")


def test_config_name_depends_only_on_content() -> None:
    a = [{"devices": [0], "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}]
    b = [{"mig-devices": {"1g.10gb": 7}, "mig-enabled": True, "devices": [0]}]
    c = [{"devices": [0], "mig-enabled": True, "mig-devices": {"1g.10gb": 6}}]
    assert planmod.config_name_for(a) == planmod.config_name_for(b)
    assert planmod.config_name_for(a) != planmod.config_name_for(c)
    assert len(planmod.config_name_for(a)) == len("gpupilot-") + 10


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.pop("plan_id"), "plan_id: required, a string"),
        (lambda d: d.update(schema="gpupilot.plan/v0"), "schema: is 'gpupilot.plan/v0'"),
        (lambda d: d["nodes"][0].update(gpus_freed="1"), "nodes[0].gpus_freed: must be an integer"),
        (
            lambda d: d["nodes"][0]["current"][0].update(mig_enabled=1),
            "nodes[0].current[0].mig_enabled: must be true or false",
        ),
        (lambda d: d["totals"].pop("gpus"), "totals.gpus: required, an integer"),
    ],
)
def test_bad_fields_are_one_line_errors(tmp_path: Path, mutate, message: str) -> None:
    data = planmod.plan_to_dict(sample_plan())
    mutate(data)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    with pytest.raises(PlanError) as err:
        planmod.load_plan(path)
    assert message in str(err.value)
    assert str(path) in str(err.value)
    assert "\n" not in str(err.value)


def test_invalid_json_names_line(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_text('{\n "schema": "gpupilot.plan/v1",\n oops\n}')
    with pytest.raises(PlanError, match=r"plan.json:3: Expecting property name .* \(JSON syntax\)$"):
        planmod.load_plan(path)


@pytest.mark.parametrize(
    ("mutate", "needle", "field"),
    [
        (lambda d: d["nodes"][0].update(gpus_freed="1"), '"gpus_freed": "1"', "nodes[0].gpus_freed"),
        (
            lambda d: d["nodes"][0]["proposed"][0]["mig_devices"].update({"1g.10gb": -1}),
            '"1g.10gb": -1',
            "nodes[0].proposed[0].mig_devices.1g.10gb",
        ),
        (lambda d: d["totals"].pop("gpus"), '"totals": {', "totals.gpus"),
    ],
)
def test_errors_name_the_line_of_the_field(tmp_path: Path, mutate, needle: str, field: str) -> None:
    """A pretty-printed plan.json: the error names the line where the field (or its object) is."""
    data = planmod.plan_to_dict(sample_plan())
    mutate(data)
    text = json.dumps(data, indent=2)
    line = next(i for i, t in enumerate(text.splitlines(), 1) if needle in t)
    path = tmp_path / "plan.json"
    path.write_text(text)
    with pytest.raises(PlanError) as err:
        planmod.load_plan(path)
    assert str(err.value).startswith(f"{path}:{line}: {field}: ")


def test_missing_file_is_plan_error(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match="cannot read the plan"):
        planmod.load_plan(tmp_path / "nope.json")


def test_a_failed_write_keeps_the_previous_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """plan --out and serve's state_dir/plan.json: a full disk mid-write leaves the good plan."""
    path = tmp_path / "plan.json"
    planmod.dump_plan(sample_plan(), path)
    before = path.read_bytes()

    def full(*_a: object) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(
        atomicfile.WriteFailed, match="No space left on device; the previous one is left intact"
    ):
        planmod.dump_plan(sample_plan(), path)
    assert path.read_bytes() == before and planmod.load_plan(path) == sample_plan()
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]


def test_the_plan_is_written_node_by_node_as_the_whole_document_would_be(tmp_path: Path) -> None:
    one = sample_plan()
    three = replace(
        one, nodes=(one.nodes[0], replace(one.nodes[0], name="b"), replace(one.nodes[0], name="c"))
    )
    for plan in (one, three, replace(one, nodes=())):
        whole = orjson.dumps(planmod.plan_to_dict(plan), option=orjson.OPT_INDENT_2) + b"\n"
        path = tmp_path / "plan.json"
        planmod.dump_plan(plan, path)
        assert (
            path.read_bytes() == whole and json.loads(whole)["nodes"] == planmod.plan_to_dict(plan)["nodes"]
        )


def test_a_node_that_fails_to_encode_keeps_the_previous_plan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "plan.json"
    planmod.dump_plan(sample_plan(), path)
    before = path.read_bytes()

    def broken(_obj: object) -> dict[str, object]:
        raise ValueError("cannot encode")

    monkeypatch.setattr(codec, "to_json", broken)
    with pytest.raises(ValueError, match="cannot encode"):
        planmod.dump_plan(sample_plan(), path)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["plan.json"]
