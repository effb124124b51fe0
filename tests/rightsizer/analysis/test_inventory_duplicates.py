"""The inventory with duplicate series (one GPU exported twice or more: two scrape jobs, an
``instance`` label that changed within the lookback): each GPU and MIG instance counts once, the
same one whatever order the answer lists the copies in. Its speed (linear) is measured in
``bench/inventory.py``."""

from __future__ import annotations

from gpupilot_common.promanswer import Sample
from rightsizer.analysis.history import inventory


class Answers:
    """The inventory's instant queries answered from lists (the client's interface)."""

    def __init__(self, gpus: list[Sample], insts: list[Sample], pods: list[Sample]) -> None:
        self.by_name = {
            "gpupilot_gpu_info": gpus,
            "gpupilot_mig_instance_info": insts,
            "gpupilot_device_pod_info": pods,
            "kube_node_labels": [Sample({"node": "node-a"}, 1.0, 0.0)],
        }

    def instant(self, query: str, at: float | None = None) -> list[Sample]:
        return next((v for k, v in self.by_name.items() if k in query), [])

    def has_data(self, selector: str, *, start: float, end: float) -> bool:
        return True


def _series(copies: int, *, memory: str = "81559") -> tuple[list[Sample], list[Sample], list[Sample]]:
    gpus, insts, pods = [], [], []
    for c in range(copies):
        base = {
            "Hostname": "node-a",
            "UUID": "GPU-1",
            "gpu": "0",
            "pci_device_id": "0x233010de",
            "mig_mode": "enabled",
            "memory_total_mib": memory,
            "instance": f"10.0.0.{c}:9400",
        }
        gpus.append(Sample(base, 1.0, 0.0))
        for gi in range(7):
            labels = {**base, "GPU_I_ID": str(gi + 7), "GPU_I_PROFILE": "1g.10gb"}
            insts.append(Sample({**labels, "placement_start": str(gi), "placement_size": "1"}, 1.0, 0.0))
        pods.append(Sample({**base, "GPU_I_ID": "7", "namespace": "ns", "pod": "p"}, 1.0, 0.0))
    return gpus, insts, pods


def test_copies_of_a_gpus_series_count_once() -> None:
    one = inventory(Answers(*_series(1)), at=0.0, lookback_s=3600.0)  # type: ignore[arg-type]
    many = inventory(Answers(*_series(50)), at=0.0, lookback_s=3600.0)  # type: ignore[arg-type]
    assert many == one
    ((node,), holders) = many
    (gpu,) = node.gpus
    assert [i.gpu_instance_id for i in gpu.instances] == [str(g) for g in range(7, 14)]
    assert {k: [str(p) for p in v] for k, v in holders.items()} == {("", "node-a", "GPU-1", "7"): ["ns/p"]}


def test_of_differing_copies_the_same_one_is_kept_whatever_the_order() -> None:
    gpus_a, insts_a, pods_a = _series(1, memory="81559")
    gpus_b, insts_b, pods_b = _series(1, memory="40960")
    forward = inventory(
        Answers(gpus_a + gpus_b, insts_a + insts_b, pods_a + pods_b),  # type: ignore[arg-type]
        at=0.0,
        lookback_s=3600.0,
    )
    backward = inventory(
        Answers(gpus_b + gpus_a, insts_b + insts_a, pods_b + pods_a),  # type: ignore[arg-type]
        at=0.0,
        lookback_s=3600.0,
    )
    assert forward == backward
    assert forward[0][0].gpus[0].memory_total_mib == 40960  # "40960" sorts before "81559"
