"""``python -m tests.support.kubedouble --plan plan.json --kubeconfig FILE``: the double as a process.

Serves on 127.0.0.1 (a free port) with the simulated MIG Manager, device plugin, scheduler and
controllers, seeded with the cluster the plan describes (:mod:`tests.support.kubedouble.fromplan`); writes a
kubeconfig for it (the file appears once it answers) and runs until SIGTERM or SIGINT. The demo
starts it to apply its plan to a simulated cluster.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from tests.support.kubedouble import fromplan
from tests.support.kubedouble.double import KubeDouble


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.kubedouble", description=__doc__)
    parser.add_argument("--plan", type=Path, required=True, help="plan.json whose cluster to simulate")
    parser.add_argument("--kubeconfig", type=Path, required=True, help="kubeconfig file to write")
    args = parser.parse_args(argv)
    try:
        plan = fromplan.load(args.plan)
    except (OSError, ValueError) as exc:
        print(f"error: {args.plan}: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with KubeDouble() as kube:
        counts = fromplan.seed(kube, plan)
        tmp = args.kubeconfig.with_name(args.kubeconfig.name + ".tmp")
        kube.write_kubeconfig(tmp)
        tmp.replace(args.kubeconfig)
        print(
            f"serving {kube.url}: {counts['nodes']} nodes, {counts['deployments']} deployments, "
            f"{counts['pods']} GPU pods; kubeconfig {args.kubeconfig}",
            flush=True,
        )
        stop.wait()
    args.kubeconfig.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
