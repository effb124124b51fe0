"""``gpupilot_build_info{version, service, python_version} 1``: which release each service runs.

The same family on every service's ``/metrics``, so one query (``count by (version, service)
(gpupilot_build_info)``) shows a fleet mid-upgrade, and an alert or dashboard can join on it."""

from __future__ import annotations

import platform

from gpupilot_common.cli import package_version

NAME = "gpupilot_build_info"
HELP = "Always 1: the gpupilot version, the service and the Python version it runs on."


def labels(service: str) -> dict[str, str]:
    """The family's labels for ``service`` (exporter, adapter, rightsizer)."""
    return {"version": package_version(), "service": service, "python_version": platform.python_version()}
