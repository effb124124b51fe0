"""Autoscaling: one HPA's metrics against its targets, its replicas, and whether it is stuck at max."""

from __future__ import annotations

from dashboards.model import Dashboard, Panel, QueryVariable, Row, Target, stat

HPA = 'namespace="$namespace", horizontalpodautoscaler="$hpa"'
PODS = f"on (namespace, pod) group_left () gpupilot:pod_hpa:info{{{HPA}}}"
GPU_METRICS = "DCGM_FI_DEV_GPU_UTIL|gpupilot:pod_gpu_utilization:percent|gpu_utilization"
AT_MAX = (
    "kube_horizontalpodautoscaler_status_current_replicas"
    " >= on (namespace, horizontalpodautoscaler) kube_horizontalpodautoscaler_spec_max_replicas"
)


def dashboard() -> Dashboard:
    d = Dashboard(
        uid="gpupilot-autoscaling",
        title="gpupilot / Autoscaling",
        description="HorizontalPodAutoscalers fed by GPU metrics: metric vs target, replicas, at-max.",
        variables=(
            QueryVariable(
                "namespace",
                "Namespace",
                "label_values(kube_horizontalpodautoscaler_spec_max_replicas, namespace)",
            ),
            QueryVariable(
                "hpa",
                "HPA",
                'label_values(kube_horizontalpodautoscaler_spec_max_replicas{namespace="$namespace"}, '
                "horizontalpodautoscaler)",
            ),
        ),
    )
    d.add(
        Row("Metrics against targets"),
        Panel(
            "GPU utilisation vs target",
            (
                Target(f"gpupilot:hpa_gpu_utilization:percent{{{HPA}}}", "mean over the HPA's pods"),
                Target(
                    "max by (metric_name) (kube_horizontalpodautoscaler_spec_target_metric"
                    f'{{{HPA}, metric_name=~"{GPU_METRICS}"}})',
                    "target ({{metric_name}})",
                ),
            ),
            "percent",
            min=0,
            max=100,
            description="Pods joined to the HPA through kube_pod_owner and kube_horizontalpodautoscaler_info.",
        ),
        Panel(
            "GPU utilisation per pod",
            (Target(f"gpupilot:pod_gpu_utilization:percent * {PODS}", "{{pod}}"),),
            "percent",
            min=0,
            max=100,
            description="gpupilot:pod_gpu_utilization:percent: right for whole GPUs and MIG slices alike.",
        ),
        Panel(
            "inference_queue_depth vs target",
            (
                Target(f"avg(inference_queue_depth * {PODS})", "mean over the HPA's pods"),
                Target(
                    "max(kube_horizontalpodautoscaler_spec_target_metric"
                    f'{{{HPA}, metric_name="inference_queue_depth"}})',
                    "target",
                ),
            ),
            "short",
            description="An application series served per pod, the second metric of the example HPA.",
        ),
        Panel(
            "GPU memory used per pod",
            (Target(f"gpupilot:pod_gpu_memory_used:mib * {PODS}", "{{pod}}"),),
            "mbytes",
        ),
        Row("Replicas"),
        Panel(
            "Replicas",
            (
                Target(f"max(kube_horizontalpodautoscaler_status_current_replicas{{{HPA}}})", "current"),
                Target(f"max(kube_horizontalpodautoscaler_status_desired_replicas{{{HPA}}})", "desired"),
                Target(f"max(kube_horizontalpodautoscaler_spec_min_replicas{{{HPA}}})", "min"),
                Target(f"max(kube_horizontalpodautoscaler_spec_max_replicas{{{HPA}}})", "max"),
            ),
            "none",
            width=16,
        ),
        stat(
            "At max replicas",
            f"max(kube_horizontalpodautoscaler_status_current_replicas{{{HPA}}})"
            f" >= bool max(kube_horizontalpodautoscaler_spec_max_replicas{{{HPA}}})",
            "none",
            width=8,
            thresholds=((1, "red"),),
            mappings=(("0", "below max"), ("1", "AT MAX")),
        ),
        Row("All autoscalers"),
        stat(
            "HPAs at max replicas",
            f"count({AT_MAX}) or vector(0)",
            "none",
            width=8,
            thresholds=((1, "orange"),),
        ),
        Panel(
            "Every HPA: current, desired and max replicas",
            (
                Target(
                    "max by (namespace, horizontalpodautoscaler) "
                    "(kube_horizontalpodautoscaler_status_current_replicas)",
                    instant=True,
                    table=True,
                ),
                Target(
                    "max by (namespace, horizontalpodautoscaler) "
                    "(kube_horizontalpodautoscaler_status_desired_replicas)",
                    instant=True,
                    table=True,
                ),
                Target(
                    "max by (namespace, horizontalpodautoscaler) (kube_horizontalpodautoscaler_spec_max_replicas)",
                    instant=True,
                    table=True,
                ),
            ),
            "none",
            kind="table",
            width=16,
        ),
    )
    return d
