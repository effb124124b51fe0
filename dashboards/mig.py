"""MIG slices: per-slice activity heatmap, idle slices, layouts and MIG Manager state per node."""

from __future__ import annotations

from dashboards.model import Dashboard, Panel, QueryVariable, Row, Target, stat

SEL = 'Hostname=~"$Hostname"'
MIG = f'{SEL}, GPU_I_ID!=""'


def dashboard() -> Dashboard:
    d = Dashboard(
        uid="gpupilot-mig",
        title="gpupilot / MIG slices",
        description="MIG instances across nodes: activity per slice, idle allocated slices, layouts.",
        variables=(
            QueryVariable(
                "Hostname",
                "Node",
                "label_values(gpupilot_mig_instance_info, Hostname)",
                all_value=".*",
            ),
        ),
    )
    d.add(
        Row("Slices"),
        stat("MIG instances", f"count(gpupilot_mig_instance_info{{{SEL}}})", "none", width=6),
        stat(
            "Allocated to pods",
            f"count(count by (UUID, GPU_I_ID) (gpupilot_device_pod_info{{{MIG}}})) or vector(0)",
            "none",
            width=6,
        ),
        stat(
            "Allocated but idle",
            f"count(gpupilot:device_idle:bool{{{MIG}}}) or vector(0)",
            "none",
            width=6,
            thresholds=((1, "orange"),),
        ),
        stat(
            "Free (no pod)",
            f"count(gpupilot_mig_instance_info{{{SEL}}} unless on (UUID, GPU_I_ID) gpupilot_device_pod_info)"
            " or vector(0)",
            "none",
            width=6,
        ),
        Panel(
            "Per-slice activity heatmap",
            (
                Target(
                    "100 * max by (Hostname, gpu, GPU_I_PROFILE, GPU_I_ID) "
                    f"(gpupilot:slice_activity:avg5m{{{MIG}}})",
                    "{{Hostname}} GPU {{gpu}} {{GPU_I_PROFILE}} #{{GPU_I_ID}}",
                ),
            ),
            "percent",
            kind="status-history",
            width=24,
            height=14,
            min=0,
            max=100,
            colour_scheme="continuous-BlYlRd",
            description=(
                "One row per MIG instance, coloured by its 5-minute mean DCGM_FI_PROF_GR_ENGINE_ACTIVE; "
                "Ampere instances without GPM have no row (see compute processes on the node dashboard)."
            ),
        ),
        Row("Idle slices"),
        Panel(
            "Allocated slices idle now",
            (
                Target(
                    f"gpupilot:device_idle:bool{{{MIG}}}"
                    " * on (Hostname, UUID, GPU_I_ID) group_left () "
                    "gpupilot:device_gpu_fraction:ratio",
                    instant=True,
                    table=True,
                ),
            ),
            "none",
            kind="table",
            decimals=3,
            description="Below 5 % activity over 5 minutes (or no compute process without GPM); value = GPU share.",
        ),
        Panel(
            "Allocated slices below 5 % all day",
            (
                Target(
                    f'100 * max_over_time(gpupilot:slice_activity:avg5m{{{MIG}, pod!=""}}[24h]) < 5',
                    instant=True,
                    table=True,
                ),
            ),
            "percent",
            kind="table",
            decimals=2,
            description="Highest 5-minute activity in 24 hours; the MIGSliceIdle24h alert's condition.",
        ),
        Row("Layouts"),
        Panel(
            "Layout per GPU (instances per profile)",
            (
                Target(
                    f"count by (Hostname, gpu, GPU_I_PROFILE) (gpupilot_mig_instance_info{{{SEL}}})",
                    instant=True,
                    table=True,
                ),
            ),
            "none",
            kind="table",
        ),
        Panel(
            "MIG Manager labels per node",
            (
                Target(
                    "max by (node, label_nvidia_com_mig_config, label_nvidia_com_mig_config_state, "
                    'label_nvidia_com_mig_strategy) (kube_node_labels{node=~"$Hostname"})',
                    instant=True,
                    table=True,
                ),
            ),
            "none",
            kind="table",
            description="nvidia.com/mig.config and .state as the MIG Manager sees them (kube-state-metrics).",
        ),
        Panel(
            "Devices per node: allocated and idle",
            (
                Target(f"gpupilot:node_slices:allocated{{{SEL}}}", "{{Hostname}} allocated"),
                Target(f"gpupilot:node_slices:idle{{{SEL}}}", "{{Hostname}} idle"),
            ),
            "none",
            width=24,
        ),
    )
    return d
