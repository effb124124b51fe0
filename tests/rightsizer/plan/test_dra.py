"""The rightsizer on DRA nodes, against a real Prometheus over a small backfilled history: node modes
(device plugin, DRA static MIG, DRA dynamic MIG), dynamic-MIG nodes never relabelled, claim-template
advice keyed by pod/claim/profile (not MIG UUID) in plan.json and the plan table; and the pure parts."""

from __future__ import annotations

import contextlib
import io
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devkit.prometheus import PrometheusServer, backfill_openmetrics
from rightsizer.analysis.types import PodKey
from rightsizer.cli import main
from rightsizer.plan import dra
from rightsizer.plan.model import load_plan
from tests.support.rightsizer.dra_history import DAYS, H100, write_history

pytestmark = pytest.mark.prometheus


@pytest.fixture(scope="module")
def planned(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, Any], str, Path]]:
    """``plan`` run once over the history: (plan.json, the table it printed, the plan's path)."""
    base = tmp_path_factory.mktemp("dra-history")
    now = time.time()
    end = now - now % 3600 - 3600
    write_history(base / "history.om", end=end)
    backfill_openmetrics(base / "history.om", base / "data", block_duration="96h")
    with PrometheusServer(base / "data", log_file=base / "prometheus.log") as server:
        out = base / "plan.json"
        at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(end))
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            code = main(
                [
                    "plan",
                    "--prometheus-url",
                    server.url,
                    "--window",
                    f"{DAYS}d",
                    "--at",
                    at,
                    "--out",
                    str(out),
                ]
            )
        assert code == 0, buf.getvalue()
        yield json.loads(out.read_text()), buf.getvalue(), out


def test_modes_are_detected_per_node(planned):
    doc, _, _ = planned
    modes = {n["node"]: n["mode"] for n in doc["dra"]["nodes"]}
    assert modes == {"node-dp": "device-plugin", "node-sta": "dra-static-mig", "node-dyn": "dra-dynamic-mig"}


def test_dynamic_mig_nodes_are_never_relabelled(planned):
    doc, _, path = planned
    assert "node-dyn" not in {n["name"] for n in doc["nodes"]}
    assert {n["name"] for n in doc["nodes"]} == {"node-dp", "node-sta"}
    assert load_plan(path).dra == doc["dra"]  # plan.json reads back for apply


def test_claim_templates_get_a_profile_from_their_workloads_history(planned):
    doc, table, _ = planned
    by_profile = {a["current_profile"]: a for a in doc["dra"]["claim_templates"]}
    infer = by_profile["3g.40gb"]
    # eight claims, eight MIG UUIDs, one workload: history keyed by pod/claim/profile
    assert infer["workload"] == "ml/infer" and len(infer["claims"]) == DAYS * 4 + 1
    assert infer["recommended_profile"] == "1g.10gb"
    assert infer["selector"] == 'device.attributes["gpu.nvidia.com"].profile == "1g.10gb"'
    assert 6900 <= infer["peak_memory_mib"] <= 7000
    assert by_profile["7g.80gb"]["recommended_profile"] == "7g.80gb"
    assert "dra: node-dyn is dra-dynamic-mig" in table
    assert "dra: node-sta is dra-static-mig: its pods get devices through ResourceClaims" in table
    assert "node-dp is" not in table  # device-plugin nodes need no word
    assert "dra: ml/infer (NVIDIA H100 80GB HBM3) on 3g.40gb: request 1g.10gb" in table


def test_pure_node_modes():
    modes = dra.node_modes(
        [("", "a"), ("", "b"), ("", "c")],
        claimed=[("", "b"), ("", "c")],
        instances_seen={("", "a"): 7, ("", "b"): 7, ("", "c"): 9},
        instances_now={("", "a"): 7, ("", "b"): 7, ("", "c"): 2},
    )
    assert [m.mode for m in modes] == [dra.DEVICE_PLUGIN, dra.DRA_STATIC, dra.DRA_DYNAMIC]


def test_pure_profile_recommendation_and_workload_grouping():
    assert (
        dra.recommend_profile(H100, current="3g.40gb", peak_memory_mib=7000, peak_activity=0.1, headroom=0.2)[
            0
        ]
        == "1g.10gb"
    )
    assert (
        dra.recommend_profile(
            H100, current="3g.40gb", peak_memory_mib=15000, peak_activity=0.1, headroom=0.2
        )[0]
        == "1g.20gb"
    )
    assert (
        dra.recommend_profile(
            H100, current="7g.80gb", peak_memory_mib=60000, peak_activity=0.9, headroom=0.2
        )[0]
        == "7g.80gb"
    )
    assert (
        dra.recommend_profile(H100, current="3g.40gb", peak_memory_mib=None, peak_activity=0.1, headroom=0.2)[
            0
        ]
        == "3g.40gb"
    )
    uses = [
        dra.ClaimUse("", "n", "ml", f"infer-5d8f7c9b6-{i:05d}", f"c{i}", "3g.40gb", H100, 5000 + i, 0.1)
        for i in range(3)
    ]
    advice = dra.advise(uses, owners={}, headroom=0.2)
    assert [(a.workload, a.claims, a.recommended_profile) for a in advice] == [
        ("ml/infer", ("c0", "c1", "c2"), "1g.10gb")
    ]
    owned = dra.advise(
        uses[:1], owners={("", PodKey("ml", uses[0].pod)): "ml/Deployment/infer"}, headroom=0.2
    )
    assert owned[0].workload == "ml/Deployment/infer"
