"""gpupilot's own health: versions, the exporters' collections, the adapter's answers and its
Prometheus traffic, the rightsizer's jobs and applies. The panels read the series the services
export about themselves (the same the GPUExporter*/GPUAdapter*/GPURightsizer* alerts read)."""

from __future__ import annotations

from dashboards.model import Dashboard, Panel, Row, Target, stat

RATE = "$__rate_interval"


def dashboard() -> Dashboard:
    d = Dashboard(
        uid="gpupilot-health",
        title="gpupilot / Health",
        description="gpupilot watching itself: versions running, exporter collections, adapter answers "
        "and values, rightsizer jobs and applies.",
        tags=("gpupilot", "gpu", "health"),
        time_from="now-6h",
    )
    d.add(
        Row("Versions"),
        Panel(
            "Running versions",
            (
                Target(
                    "count by (service, version, python_version) (gpupilot_build_info)",
                    instant=True,
                    table=True,
                ),
            ),
            "none",
            kind="table",
            width=24,
            height=6,
            description="Pods of each service per version: two versions of one service mean an upgrade "
            "is rolling (or stuck).",
        ),
        Row("Exporter"),
        stat(
            "Exporters without a backend",
            "count(gpupilot_exporter_backend_up == 0) or vector(0)",
            "none",
            width=6,
            thresholds=((1, "red"),),
        ),
        stat(
            "Oldest snapshot",
            "max(gpupilot_exporter_snapshot_age_seconds)",
            "s",
            width=6,
            thresholds=((60, "orange"), (180, "red")),
        ),
        Panel(
            "Collection errors by kind",
            (Target(f"sum by (kind) (rate(gpupilot_exporter_collection_errors_total[{RATE}]))", "{{kind}}"),),
            "ops",
            description="NVML read, timeout and per-field errors (GPUExporterNVMLErrors), pod-resources errors.",
        ),
        Panel(
            "Collection duration (slowest exporter)",
            (Target("max(gpupilot_exporter_collection_duration_seconds)", "slowest"),),
            "s",
            width=24,
        ),
        Row("Adapter"),
        Panel(
            "Requests by kind and code",
            (
                Target(
                    f"sum by (kind, code) (rate(gpupilot_adapter_requests_total[{RATE}]))",
                    "{{kind}} {{code}}",
                ),
            ),
            "reqps",
            stack=True,
        ),
        Panel(
            "5xx answers",
            (
                Target(
                    f'sum by (kind) (rate(gpupilot_adapter_requests_total{{code=~"5.."}}[{RATE}])) or vector(0)',
                    "{{kind}}",
                ),
            ),
            "reqps",
            description="503: Prometheus down or the value too old; HPAs keep their replica count meanwhile.",
        ),
        Panel(
            "Oldest value held",
            (Target("max by (instance) (gpupilot_adapter_values_age_seconds)", "{{instance}}"),),
            "s",
            thresholds=((120, "orange"), (300, "red")),
            description="Past adapter.maxValueAge (120 s) a value is not served; GPUAdapterValuesStale at 300 s.",
        ),
        Panel(
            "Prometheus requests failing",
            (
                Target(
                    f"sum by (instance) (rate(gpupilot_adapter_prometheus_errors_total[{RATE}])) "
                    f"/ sum by (instance) (rate(gpupilot_adapter_prometheus_query_duration_seconds_count[{RATE}]))",
                    "{{instance}}",
                ),
            ),
            "percentunit",
            min=0,
            max=1,
            thresholds=((0.5, "red"),),
            description="GPUAdapterPrometheusUnreachable fires at half for 5 minutes.",
        ),
        Panel(
            "Answer time p99 by kind",
            (
                Target(
                    "histogram_quantile(0.99, sum by (kind, le) "
                    f"(rate(gpupilot_adapter_request_duration_seconds_bucket[{RATE}])))",
                    "{{kind}}",
                ),
            ),
            "s",
        ),
        Panel(
            "Serving certificate: days left",
            (
                Target(
                    "(min by (instance) (gpupilot_adapter_serving_certificate_expiry_timestamp_seconds) - time()) / 86400",
                    "{{instance}}",
                ),
            ),
            "d",
            thresholds=((0, "red"), (14, "orange"), (30, "green")),
        ),
        Row("Rightsizer"),
        Panel(
            "Since the last successful run",
            (
                Target(
                    "time() - max by (job) (gpupilot_rightsizer_last_success_timestamp_seconds)",
                    "{{job}}",
                ),
            ),
            "s",
            description="GPURightsizerPlanStale and GPURightsizerReportStale compare it with each job's interval.",
        ),
        Panel(
            "Job failures",
            (Target(f"sum by (job) (increase(gpupilot_rightsizer_job_failures_total[{RATE}]))", "{{job}}"),),
            "none",
        ),
        Panel(
            "Auto-apply results",
            (Target(f"sum by (result) (increase(gpupilot_rightsizer_applies_total[{RATE}]))", "{{result}}"),),
            "none",
            stack=True,
        ),
        Panel(
            "Latest plan: idle slices and freeable GPUs",
            (
                Target(
                    'max(gpupilot_rightsizer_idle_slices{allocated="true"})',
                    "allocated devices idle all window",
                ),
                Target("max(gpupilot_rightsizer_freeable_gpus)", "freeable GPUs"),
            ),
            "none",
            description="The plan's idle devices are the report's \"allocated but idle\" figure.",
        ),
    )
    return d
