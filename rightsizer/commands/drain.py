"""``gpupilot-rightsizer drain``: ask a running serve to stop auto-applying at its next safe step, and
wait until no apply holds the apply Lease: what the chart runs before an upgrade that switches
auto-apply off (and before an uninstall), so the write rights never go while a node is mid-step.

It writes ``gpupilot.io/auto-apply-drain: <now>`` on the stop-signal ConfigMap
(:mod:`rightsizer.serve.stopsignal`; a serve started later ignores it), then watches the Lease
``gpupilot-rightsizer-apply`` until it has no holder or its holder stopped renewing it. Exit 0: no
apply in flight (or none could be: no ConfigMap, no Lease); 1: an apply still held it at
``--timeout``, or the API could not be reached (nothing was switched off: run it again)."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from collections.abc import Callable
from pathlib import Path

from gpupilot_common import argtypes, timefmt
from rightsizer.apply.lease import LEASE_NAME
from rightsizer.clients.kube import ConflictError, Kube, KubeError, KubeSettings, PermanentKubeError
from rightsizer.clients.lease import LeaseObserver, lease_spec
from rightsizer.serve.stopsignal import ANN_DRAIN

_timeout = argtypes.bounded(timefmt.parse_duration, low=1.0, high=86400.0, show=timefmt.format_duration)
POLL_S = 5.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Ask a running 'serve' to stop auto-applying at its next safe step (the annotation "
        f"{ANN_DRAIN} on its stop-signal ConfigMap) and wait until no apply holds the apply Lease. "
        "The chart runs it before an upgrade that switches auto-apply off and before an uninstall. "
        "Exit 0: nothing in flight; 1: an apply still runs at --timeout, or the API is unreachable."
    )
    parser.add_argument(
        "--namespace", required=True, help="namespace of the stop-signal ConfigMap (serve's own)"
    )
    parser.add_argument(
        "--configmap", required=True, help="the stop-signal ConfigMap (auto_apply.stop_signal)"
    )
    parser.add_argument(
        "--lease-namespace", required=True, help="namespace of the apply Lease (the GPU Operator's)"
    )
    parser.add_argument(
        "--timeout", type=_timeout, default=1500.0, metavar="DURATION", help="how long to wait (default 25m)"
    )
    parser.add_argument("--kubeconfig", type=Path, default=None, help="default: the in-cluster account")


def request(kube: Kube, namespace: str, name: str, *, now: dt.datetime) -> bool:
    """Write the drain request; False when the ConfigMap does not exist (no serve to drain)."""
    for _ in range(8):
        found = kube.get_configmap(namespace, name)
        if found is None:
            return False
        meta = found.setdefault("metadata", {})
        meta.setdefault("annotations", {})[ANN_DRAIN] = now.strftime("%Y-%m-%dT%H:%M:%SZ")
        try:
            kube.replace_configmap(found)
            return True
        except ConflictError:
            continue
    raise KubeError(f"configmap {namespace}/{name} kept changing: the drain request was not written")


def wait_free(
    kube: Kube,
    namespace: str,
    *,
    timeout_s: float,
    monotonic: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Until the apply Lease has no live holder: "" then, else the holder still there at the end."""
    observer = LeaseObserver(monotonic)
    deadline = monotonic() + timeout_s
    while True:
        try:
            spec = lease_spec(kube.get_lease(namespace, LEASE_NAME))
        except PermanentKubeError as exc:
            if exc.status == 403:  # no right to it: this identity never applied, nothing to wait for
                return ""
            raise
        holder = spec.get("holderIdentity") or ""
        if not holder or observer.expired(spec, default_duration_s=60.0):
            return ""
        if monotonic() >= deadline:
            return str(holder)
        sleep(POLL_S)


def run(args: argparse.Namespace) -> int:
    try:
        kube = Kube.connect(KubeSettings(kubeconfig=args.kubeconfig))
        try:
            if not request(kube, args.namespace, args.configmap, now=dt.datetime.now(dt.UTC)):
                print(f"nothing to drain: no ConfigMap {args.namespace}/{args.configmap} (no serve ran here)")
                return 0
            print(
                f"drain requested on ConfigMap {args.namespace}/{args.configmap}; waiting for the apply Lease"
            )
            holder = wait_free(kube, args.lease_namespace, timeout_s=args.timeout)
        finally:
            kube.close()
    except KubeError as exc:
        print(f"error: {exc} (nothing was switched off: run it again)", file=sys.stderr)
        return 1
    if holder:
        print(
            f"error: {holder} still holds the apply Lease {args.lease_namespace}/{LEASE_NAME} after "
            f"{timefmt.format_duration(args.timeout)}: an apply step is still running; try again later "
            "(or give helm upgrade a longer --timeout)",
            file=sys.stderr,
        )
        return 1
    print(f"no auto-apply in flight (Lease {args.lease_namespace}/{LEASE_NAME} free)")
    return 0
