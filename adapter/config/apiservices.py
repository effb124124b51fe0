"""Who serves the metrics APIs now: a check before gpupilot's APIServices are installed.

An APIService is named ``<version>.<group>`` (``v1beta1.custom.metrics.k8s.io``), so gpupilot's and
prometheus-adapter's have the same name: ``kubectl apply`` would silently repoint an existing one at
gpupilot's Service, and gpupilot's ``v1beta2`` (versionPriority 200) would become the group's
preferred version, so HPAs on prometheus-adapter's metrics would get 404s. This module reads the
APIServices gpupilot would install and says, per API group, whether another server owns it. The
``check-apiservices`` command refuses (exit 1) unless ``--take-over``; ``serve`` logs the same finding
as a warning at start.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpupilot_common.table import Column, render

CUSTOM = "custom.metrics.k8s.io"
EXTERNAL = "external.metrics.k8s.io"
OURS: dict[str, tuple[str, ...]] = {CUSTOM: ("v1beta2", "v1beta1"), EXTERNAL: ("v1beta1",)}
"""The APIServices deploy/adapter installs, by group."""


def apiservice_names(*, external: bool) -> list[str]:
    groups = [CUSTOM, EXTERNAL] if external else [CUSTOM]
    return [f"{v}.{g}" for g in groups for v in OURS[g]]


@dataclass(frozen=True)
class Finding:
    name: str
    group: str
    served_by: str
    """``namespace/service``, ``local`` (the API server itself), or ``-`` when absent."""
    state: str
    """``absent``, ``ours`` or ``foreign``."""


def findings(found: Mapping[str, Mapping[str, Any] | None], *, namespace: str, service: str) -> list[Finding]:
    out = []
    for name, obj in found.items():
        group = name.split(".", 1)[1]
        if obj is None:
            out.append(Finding(name, group, "-", "absent"))
            continue
        ref = (obj.get("spec") or {}).get("service")
        if not ref:
            out.append(Finding(name, group, "local", "foreign"))
            continue
        owner = f"{ref.get('namespace', '')}/{ref.get('name', '')}"
        state = "ours" if owner == f"{namespace}/{service}" else "foreign"
        out.append(Finding(name, group, owner, state))
    return out


def conflicts(found: list[Finding]) -> list[str]:
    """One line per API group another server owns (any of its versions): installing would take it over."""
    lines = []
    for group in dict.fromkeys(f.group for f in found):
        foreign = [f for f in found if f.group == group and f.state == "foreign"]
        if not foreign:
            continue
        owners = ", ".join(sorted({f.served_by for f in foreign}))
        names = ", ".join(f.name for f in foreign)
        lines.append(
            f"{group} is served by {owners} ({names}): installing gpupilot's APIServices would take the "
            "group over and HPAs on that server's metrics would get 404s; migrate them first (docs/deploy.md#2c-a-cluster-that-already-runs-prometheus-adapter) or pass "
            "--take-over"
        )
    return lines


COLUMNS = (Column("APISERVICE"), Column("SERVED BY"), Column("STATE", wrap=True))


def table(found: list[Finding]) -> str:
    return render(COLUMNS, [(f.name, f.served_by, f.state) for f in found])
