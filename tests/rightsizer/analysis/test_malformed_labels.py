"""A malformed label on one node's series sets that node aside, never the fleet's plan: a MIG
placement that is not a number, a GPU index past any int, a memory total that is infinite — each
gives one line naming the node, the series and the label, and the other node is inventoried."""

from __future__ import annotations

import logging

import pytest

from gpupilot_common.promanswer import Sample
from rightsizer.analysis.history import inventory
from tests.rightsizer.analysis.test_inventory_duplicates import Answers


def _node(host: str, **bad: str) -> tuple[list[Sample], list[Sample], list[Sample]]:
    base = {
        "Hostname": host,
        "UUID": f"GPU-{host}",
        "gpu": "0",
        "pci_device_id": "0x233010de",
        "mig_mode": "enabled",
        "memory_total_mib": "81559",
    }
    gpu = {**base, **{k: v for k, v in bad.items() if k in ("gpu", "memory_total_mib")}}
    insts = []
    for gi in range(7):
        labels = {**base, "GPU_I_ID": str(gi + 7), "GPU_I_PROFILE": "1g.10gb"}
        labels |= {"placement_start": str(gi), "placement_size": "1"}
        if gi == 3:
            labels |= {k: v for k, v in bad.items() if k.startswith("placement")}
        insts.append(Sample(labels, 1.0, 0.0))
    return (
        [Sample(gpu, 1.0, 0.0)],
        insts,
        [Sample({**base, "GPU_I_ID": "7", "namespace": "ns", "pod": "p"}, 1.0, 0.0)],
    )


@pytest.mark.parametrize(
    ("bad", "said"),
    [
        (
            {"placement_start": "x"},
            "gpupilot_mig_instance_info series (GPU GPU-gpu-b) has label placement_start='x'",
        ),
        ({"gpu": "1" + "0" * 400}, "gpupilot_gpu_info series (GPU GPU-gpu-b) has label gpu="),
        (
            {"memory_total_mib": "inf"},
            "gpupilot_gpu_info series (GPU GPU-gpu-b) has label memory_total_mib='inf'",
        ),
    ],
)
def test_one_malformed_label_sets_its_node_aside_and_the_rest_is_inventoried(
    bad: dict[str, str], said: str, caplog: pytest.LogCaptureFixture
) -> None:
    good, broken = _node("gpu-a"), _node("gpu-b", **bad)
    answers = Answers(good[0] + broken[0], good[1] + broken[1], good[2] + broken[2])
    skipped: list[str] = []
    with caplog.at_level(logging.WARNING):
        nodes, _ = inventory(answers, at=0.0, lookback_s=3600.0, skipped=skipped)  # type: ignore[arg-type]
    assert [n.name for n in nodes] == ["gpu-a"]
    assert len(nodes[0].gpus[0].instances) == 7
    (line,) = skipped
    assert line.startswith("node gpu-b left out of the plan: ") and said in line and "\n" not in line
    assert len(line) < 300
    assert [r.getMessage() for r in caplog.records] == [line]
