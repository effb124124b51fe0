"""kube-state-metrics series serve's alerts and reports lean on, and the labels they must carry.

kube-state-metrics >= 2.0 exports no Kubernetes label in ``kube_node_labels``/``kube_pod_labels``
unless it is allow-listed (``--metric-labels-allowlist``). Nothing fails then: the
``MIGReconfigurationFailed`` alert simply never fires and the report groups pods by owner only. So
``serve --check`` prints, and ``serve`` logs once after its first plan, a line for each gap."""

from __future__ import annotations

from collections.abc import Callable

from rightsizer.plan.nodelabels import ALLOWLIST

POD_ALLOWLIST = "pods=[app.kubernetes.io/name,app]"

Count = Callable[[str], float]
"""A PromQL expression → the value of its one sample (0 when the answer is empty)."""


def gaps(count: Count) -> list[str]:
    """One line per missing series or allow-listed label (none: everything serve reads is there)."""
    out = []
    mig = count('count(gpupilot_gpu_info{mig_mode="enabled"})')
    nodes = count("count(kube_node_labels)")
    if mig and not nodes:
        out.append(
            "no kube_node_labels in Prometheus (kube-state-metrics not scraped?): the MIGReconfigurationFailed "
            "alert cannot fire (docs/deploy.md#kube-state-metrics)"
        )
    elif mig and not count('count(kube_node_labels{label_nvidia_com_mig_config!=""})'):
        out.append(
            "kube_node_labels carries no nvidia.com/mig.config label: the MIGReconfigurationFailed alert cannot "
            f"fire; allow-list the MIG labels in kube-state-metrics (--metric-labels-allowlist={ALLOWLIST}; "
            "docs/deploy.md#kube-state-metrics)"
        )
    pods = count("count(kube_pod_labels)")
    if pods and not count(
        'count(kube_pod_labels{label_app_kubernetes_io_name!=""}) or count(kube_pod_labels{label_app!=""})'
    ):
        out.append(
            "kube_pod_labels carries no app.kubernetes.io/name or app label: the report names workloads by "
            f"their owners only; allow-list them (--metric-labels-allowlist={POD_ALLOWLIST}; "
            "docs/deploy.md#kube-state-metrics)"
        )
    return out
