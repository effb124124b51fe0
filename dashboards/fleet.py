"""Fleet overview: GPUs, utilisation, power, errors, idle slices and waste across every node."""

from __future__ import annotations

from dashboards.model import Dashboard, Panel, Row, Target, stat

# GPU-level series repeat once per container on a time-sliced whole GPU: `max by` the GPU first.
POWER_PER_GPU = "max by (Hostname, UUID) (DCGM_FI_DEV_POWER_USAGE)"


def dashboard() -> Dashboard:
    d = Dashboard(
        uid="gpupilot-fleet",
        title="gpupilot / Fleet overview",
        description="Every GPU node: inventory, utilisation, power, errors, idle allocated slices and waste.",
    )
    d.add(
        Row("Inventory"),
        stat("GPUs", "count(gpupilot_gpu_info)", "none"),
        stat("MIG instances", "count(gpupilot_mig_instance_info)", "none"),
        stat("Devices allocated to pods", "sum(gpupilot:node_slices:allocated)", "none"),
        stat(
            "Allocated but idle devices",
            "sum(gpupilot:node_slices:idle)",
            "none",
            thresholds=((1, "orange"),),
        ),
        stat(
            "Idle allocated compute (GPU-equivalents)",
            "gpupilot:fleet_waste:gpu_equivalents",
            "none",
            decimals=2,
            thresholds=((0.5, "orange"), (2, "red")),
        ),
        stat(
            "Lost GPUs",
            "count(gpupilot_gpu_lost == 1) or vector(0)",
            "none",
            thresholds=((1, "red"),),
        ),
        Row("Utilisation"),
        Panel(
            "Mean device activity by node",
            (Target("100 * avg by (Hostname) (gpupilot:slice_activity:avg5m)", "{{Hostname}}"),),
            "percent",
            min=0,
            max=100,
            description="5-minute mean activity of every whole GPU and MIG instance on the node.",
        ),
        Panel(
            "Allocated device activity by namespace",
            (
                Target(
                    '100 * avg by (namespace) (gpupilot:slice_activity:avg5m{pod!=""})',
                    "{{namespace}}",
                ),
            ),
            "percent",
            min=0,
            max=100,
            description="Whole GPUs from DCGM_FI_DEV_GPU_UTIL, MIG slices from DCGM_FI_PROF_GR_ENGINE_ACTIVE.",
        ),
        Row("Power and temperature"),
        Panel(
            "Power draw by node",
            (Target(f"sum by (Hostname) ({POWER_PER_GPU})", "{{Hostname}}"),),
            "watt",
            stack=True,
        ),
        Panel(
            "Hottest GPU per node",
            (Target("max by (Hostname) (DCGM_FI_DEV_GPU_TEMP)", "{{Hostname}}"),),
            "celsius",
            thresholds=((85, "red"),),
            description="The GPUHighTemperature alert fires above 85 °C for 5 minutes.",
        ),
        Row("Errors"),
        Panel(
            "Xid errors by node and code",
            (
                Target(
                    "sum by (Hostname, xid) (increase(gpupilot_xid_errors_total[$__rate_interval]))",
                    "{{Hostname}} Xid {{xid}}",
                ),
            ),
            "short",
        ),
        Panel(
            "Double-bit ECC errors and row-remap failures",
            (
                Target(
                    "sum by (Hostname) (max by (Hostname, UUID) (DCGM_FI_DEV_ECC_DBE_VOL_TOTAL))",
                    "{{Hostname}} DBE",
                ),
                Target(
                    "sum by (Hostname) (max by (Hostname, UUID) (DCGM_FI_DEV_ROW_REMAP_FAILURE))",
                    "{{Hostname}} row-remap failures",
                ),
            ),
            "short",
        ),
        Row("Slices and waste"),
        Panel(
            "Devices: total, allocated, idle",
            (
                Target("sum(gpupilot:node_slices:total)", "total"),
                Target("sum(gpupilot:node_slices:allocated)", "allocated"),
                Target("sum(gpupilot:node_slices:idle)", "allocated but idle"),
            ),
            "none",
            description="Whole GPUs plus MIG instances; idle = below 5 % activity over 5 minutes.",
        ),
        Panel(
            "Idle allocated compute over time",
            (Target("gpupilot:fleet_waste:gpu_equivalents", "GPU-equivalents"),),
            "none",
            decimals=2,
            description="Idle devices weighted by size: a whole GPU counts 1, a 3g slice of 7 counts 3/7.",
        ),
        Panel(
            "GPUs by node, model and driver",
            (
                Target(
                    "count by (Hostname, modelName, mig_mode, DCGM_FI_DRIVER_VERSION) (gpupilot_gpu_info)",
                    instant=True,
                    table=True,
                ),
            ),
            "none",
            kind="table",
            width=24,
        ),
    )
    return d
