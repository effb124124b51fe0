"""``gpupilot-adapter check-apiservices`` and the startup warning of ``serve``.

Run the check before ``kubectl apply`` of deploy/adapter: it reads the APIServices gpupilot would
install and exits 1, naming the owner, when another server (prometheus-adapter, KEDA, …) serves
any version of the same API group, unless ``--take-over`` says that is intended. Exit 0 when the
groups are free or already gpupilot's; 2 when the API cannot be read.
"""

from __future__ import annotations

import argparse
import logging
from typing import Protocol

from adapter.config import apiservices
from adapter.errors import KubernetesUnavailable
from gpupilot_common import argtypes

log = logging.getLogger("adapter")


class ApiServiceReader(Protocol):
    def apiservices(self, names: list[str]) -> dict[str, dict[str, object] | None]: ...


owner_arg = argtypes.namespaced_name(kind="SERVICE", example="gpupilot/gpupilot-adapter")


def add_owner_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--apiservice-owner",
        type=owner_arg,
        default=("gpupilot", "gpupilot-adapter"),
        metavar="NAMESPACE/SERVICE",
        help="the Service gpupilot's APIServices point at (default gpupilot/gpupilot-adapter)",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kubeconfig",
        default="",
        help="kubeconfig file (default, as kubectl: $KUBECONFIG, ~/.kube/config, else the in-cluster service account)",
    )
    parser.add_argument("--context", default="", help="kubeconfig context (default: the current one)")
    add_owner_flag(parser)
    parser.add_argument(
        "--external",
        action="store_true",
        help="also check external.metrics.k8s.io (when installing the deploy/adapter/external component)",
    )
    parser.add_argument(
        "--take-over",
        action="store_true",
        help="taking the group over from the other server is intended (after migrating its HPAs)",
    )


def check(reader: ApiServiceReader, args: argparse.Namespace, out: list[str]) -> int:
    namespace, service = args.apiservice_owner
    found = apiservices.findings(
        reader.apiservices(apiservices.apiservice_names(external=args.external)),
        namespace=namespace,
        service=service,
    )
    out.append(apiservices.table(found))
    problems = apiservices.conflicts(found)
    if not problems:
        out.append("check-apiservices: OK: nothing else serves these API groups")
        return 0
    if args.take_over:
        out.extend(
            f"check-apiservices: taking over (--take-over): {p.split(': installing')[0]}" for p in problems
        )
        return 0
    out.extend(f"check-apiservices: REFUSED: {p}" for p in problems)
    return 1


def run(args: argparse.Namespace) -> int:
    from adapter.clients.kube import KubeClient  # noqa: PLC0415 - only this command needs the client here

    try:
        kube = KubeClient(kubeconfig=args.kubeconfig, context=args.context)
        try:
            lines: list[str] = []
            code = check(kube, args, lines)
        finally:
            kube.close()
    except KubernetesUnavailable as exc:
        print(f"check-apiservices: cannot tell: {exc}")
        return 2
    print("\n".join(lines))
    return code


def warn_at_start(reader: ApiServiceReader, *, owner: tuple[str, str], external: bool) -> list[str]:
    """At ``serve`` start: one warning per API group another server owns (never fatal)."""
    try:
        found = apiservices.findings(
            reader.apiservices(apiservices.apiservice_names(external=external)),
            namespace=owner[0],
            service=owner[1],
        )
    except Exception as exc:
        log.info("APIService ownership not checked: %s", " ".join(str(exc).split())[:200])
        return []
    warnings = [p.split("; migrate")[0] for p in apiservices.conflicts(found)]
    for w in warnings:
        log.warning("%s; requests for that group do not reach this adapter", w)
    return warnings
