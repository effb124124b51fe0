"""Messages in the serve config's terms: the shared code names ``apply``/``plan`` flags
(``pass --repoint-cluster-policy``); a ``serve`` operator sets fields of a file instead."""

from __future__ import annotations

import re

FIELDS = {
    "--prometheus-url": "prometheus_url",
    "--repoint-cluster-policy": "auto_apply.repoint_cluster_policy",
    "--namespace": "auto_apply.operator_namespace",
    "--configmap": "auto_apply.mig_configmap",
    "--kubeconfig": "auto_apply.kubeconfig",
    "--configmap-sync": "auto_apply.configmap_sync",
    "--lease-duration": "auto_apply.lease_duration",
    "--max-parallel": "auto_apply.max_parallel",
}
SWITCHES = frozenset({"--repoint-cluster-policy"})
"""Flags without a value: their field is set to ``true``."""
_PASS = re.compile(r"\bpass (--[a-z][a-z-]*)(?: ([A-Za-z0-9][\w.-]*))?")
_FLAG = re.compile(r"--[a-z][a-z-]*")
_NO_FIELD = re.compile(r"\s*\((?:use|pass) --at\b[^()]*\)")
"""Advice about flags ``serve`` has no field for (it plans at its own now): dropped."""


def in_config_terms(message: str, source: str) -> str:
    """``pass --namespace gpu`` → ``set auto_apply.operator_namespace: gpu in FILE``; any other known
    flag → ``field (in FILE)``; unknown flags are left as they are."""

    def passed(m: re.Match[str]) -> str:
        flag, value = m.group(1), m.group(2)
        key = FIELDS.get(flag)
        if key is None:
            return m.group(0)
        if flag in SWITCHES or value is None:
            rest = f" {value}" if value is not None else ""
            return f"set {key}: true in {source}{rest}"
        return f"set {key}: {value} in {source}"

    def flag(m: re.Match[str]) -> str:
        key = FIELDS.get(m.group(0))
        return m.group(0) if key is None else f"{key} in {source}"

    return _FLAG.sub(flag, _PASS.sub(passed, _NO_FIELD.sub("", message)))
