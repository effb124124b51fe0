"""``plan``'s inventory with duplicate series: one GPU exported many times over (two scrape jobs, an
``instance`` label that changed within the lookback), beside the same fleet without duplicates.

The fleet: 50 nodes × 8 H100 GPUs, each as 7 × 1g.10gb with one pod; its GPU, MIG instance and pod
info series come from an in-memory client (the inventory's queries are answered from lists: what is
measured is the inventory's own work on the answers, not Prometheus). One GPU's series are repeated
``copies`` times. Goal: linear — 90,000 copies (810,000 samples with their instances and pods) well
under a few seconds, and the same inventory as without the copies.
``python -m bench.inventory [--copies 4000,90000]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from gpupilot_common.promanswer import Sample
from gpupilot_common.table import Column, render
from rightsizer.analysis.history import inventory

NODES, GPUS = 50, 8
H100_PCI = "0x233010de"


class DuplicatingClient:
    """Answers the inventory's four instant queries; GPU 0 of node 0 has ``copies`` copies."""

    def __init__(self, copies: int) -> None:
        self.gpus: list[Sample] = []
        self.insts: list[Sample] = []
        self.pods: list[Sample] = []
        self.labels = [
            Sample({"node": f"node-{n:03d}", "label_nvidia_com_mig_strategy": "mixed"}, 1.0, 0.0)
            for n in range(NODES)
        ]
        for n in range(NODES):
            for g in range(GPUS):
                for c in range(copies if (n, g) == (0, 0) else 1):
                    base = {
                        "Hostname": f"node-{n:03d}",
                        "UUID": f"GPU-{n}-{g}",
                        "gpu": str(g),
                        "pci_device_id": H100_PCI,
                        "mig_mode": "enabled",
                        "memory_total_mib": "81559",
                        "instance": f"10.0.{c // 256}.{c % 256}:9400",
                    }
                    self.gpus.append(Sample(base, 1.0, 0.0))
                    for gi in range(7):
                        inst = {
                            **base,
                            "GPU_I_ID": str(gi + 7),
                            "GPU_I_PROFILE": "1g.10gb",
                            "placement_start": str(gi),
                            "placement_size": "1",
                        }
                        self.insts.append(Sample(inst, 1.0, 0.0))
                    pod = {**base, "GPU_I_ID": "7", "namespace": "serve", "pod": f"p-{n}-{g}"}
                    self.pods.append(Sample(pod, 1.0, 0.0))

    def instant(self, query: str, at: float | None = None) -> list[Sample]:
        for name, answer in (
            ("gpupilot_gpu_info", self.gpus),
            ("gpupilot_mig_instance_info", self.insts),
            ("gpupilot_device_pod_info", self.pods),
            ("kube_node_labels", self.labels),
        ):
            if name in query:
                return answer
        return []

    def has_data(self, selector: str, *, start: float, end: float) -> bool:
        return True


def timed(copies: int) -> tuple[float, int, object]:
    """(seconds, samples answered, the inventory) for one run."""
    client = DuplicatingClient(copies)
    started = time.perf_counter()
    result = inventory(client, at=0.0, lookback_s=3600.0)  # type: ignore[arg-type]
    took = time.perf_counter() - started
    return took, len(client.gpus) + len(client.insts) + len(client.pods), result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.inventory", description=__doc__)
    parser.add_argument("--copies", default="4000,90000", help="comma-separated copies of one GPU's series")
    args = parser.parse_args(argv)
    base_s, base_n, expected = timed(1)
    per = base_s / base_n * 1e6
    rows = [["no copies (baseline)", f"{base_n:,}", f"{base_s:.3f}", f"{per:.2f}", "1.0×", "yes"]]
    worst = 0.0
    for copies in (int(c) for c in args.copies.split(",")):
        took, samples, result = timed(copies)
        same = result == expected
        worst = max(worst, took)
        each = took / samples * 1e6
        rows.append(
            [
                f"{copies:,} copies of one GPU",
                f"{samples:,}",
                f"{took:.3f}",
                f"{each:.2f}",
                f"{each / per:.1f}×",
                "yes" if same else "NO",
            ]
        )
        if not same:
            print(f"inventory with {copies} copies differs from the one without", file=sys.stderr)
            return 1
    columns = [
        Column("case"),
        Column("samples", right=True),
        Column("seconds", right=True),
        Column("µs/sample", right=True),
        Column("µs/sample vs baseline", right=True),
        Column("same inventory"),
    ]
    print(render(columns, rows))
    print(
        f"goal: linear (µs/sample near the baseline's), the largest well under a few seconds: {worst:.2f} s"
    )
    return 0 if worst < 5 else 1


if __name__ == "__main__":
    raise SystemExit(main())
