"""``python -m devkit.cluster up``: a real Kubernetes control plane on loopback until Ctrl-C.

Builds the pinned components when missing (:mod:`devkit.gobuild`), starts etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and KWOK, adds the simulated GPU nodes of a scenario
(``--scenario``, default the demo fleet) with the capacities NVIDIA's device plugin would advertise
and runs the MIG Manager stand-in, then prints the admin kubeconfig's path and waits. Ctrl-C (or
SIGTERM) stops every process it started.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from devkit import gobuild
from devkit.cluster import ClusterError, ControlPlane, nodes
from devkit.cluster.migmanager import MigManager

DEFAULT_SCENARIO = Path(__file__).resolve().parents[2] / "examples" / "fleet-demo.yaml"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devkit.cluster",
        description="A real Kubernetes control plane (built from upstream's Go modules) on loopback, "
        "with simulated GPU nodes from a scenario.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start it and wait until Ctrl-C")
    up.add_argument(
        "--dir", type=Path, help="work folder (kubeconfigs, certificates, logs); default: a new temporary one"
    )
    up.add_argument(
        "--scenario",
        type=Path,
        default=DEFAULT_SCENARIO,
        help="simulator scenario whose nodes to add (default: %(default)s)",
    )
    up.add_argument("--no-nodes", action="store_true", help="start the control plane without GPU nodes")
    args = parser.parse_args(argv)

    directory = args.dir or Path(tempfile.mkdtemp(prefix="gpupilot-cluster-"))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    # Ctrl-C even where the shell started us with SIGINT ignored (a background job)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    started = time.monotonic()
    try:
        with ControlPlane(directory) as cp:
            manager = None
            if not args.no_nodes:
                created = nodes.add_from_scenario(cp.admin_kubeconfig, args.scenario)
                manager = MigManager(cp.admin_kubeconfig).start()
                print(f"==> {len(created)} GPU nodes from {args.scenario.name}: {', '.join(created)}")
            print(
                f"==> Kubernetes {gobuild.KUBERNETES_RELEASE} ready in {time.monotonic() - started:.0f}s at {cp.url}"
            )
            print(f"    export KUBECONFIG={cp.admin_kubeconfig}")
            print(f"    kubectl: {gobuild.binary('kube').with_name('kubectl')}")
            print(f"    logs: {cp.logs}    Ctrl-C stops everything")
            try:
                while not stop.wait(1):
                    gone = set(c.name for c in cp.components) - set(cp.alive())
                    if gone:
                        print(
                            f"devkit.cluster: {', '.join(sorted(gone))} exited; see {cp.logs}",
                            file=sys.stderr,
                        )
                        return 1
            except KeyboardInterrupt:
                pass
            finally:
                if manager is not None:
                    manager.stop()
            print("==> stopping")
    except (ClusterError, gobuild.GoToolError, nodes.NodeError) as exc:
        print(f"devkit.cluster: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("==> stopped while starting")
        return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
