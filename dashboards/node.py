"""Node and GPU detail: what NVIDIA's DCGM dashboard shows, per GPU of one node, plus MIG rows."""

from __future__ import annotations

from dashboards.model import Dashboard, Panel, QueryVariable, Row, Target, stat

SEL = 'Hostname="$Hostname", gpu=~"$gpu"'
GPU = "GPU {{gpu}}"
SLICE = "GPU {{gpu}} {{GPU_I_PROFILE}} #{{GPU_I_ID}}"


def _per_gpu(field: str) -> str:
    """A GPU-level field once per GPU (it repeats per container on a time-sliced GPU)."""
    return f"max by (gpu) ({field}{{{SEL}}})"


def dashboard() -> Dashboard:
    d = Dashboard(
        uid="gpupilot-node",
        title="gpupilot / Node and GPU detail",
        description="One node's GPUs: the panels of NVIDIA's DCGM dashboard, plus MIG instances.",
        variables=(
            QueryVariable("Hostname", "Node", "label_values(gpupilot_gpu_info, Hostname)"),
            QueryVariable(
                "gpu",
                "GPU",
                'label_values(gpupilot_gpu_info{Hostname="$Hostname"}, gpu)',
                all_value=".*",
            ),
        ),
    )
    d.add(
        Row("Temperature and power"),
        Panel(
            "GPU temperature",
            (Target(_per_gpu("DCGM_FI_DEV_GPU_TEMP"), GPU),),
            "celsius",
            width=18,
            thresholds=((85, "red"),),
        ),
        Panel(
            "Average temperature",
            (Target(f"avg({_per_gpu('DCGM_FI_DEV_GPU_TEMP')})"),),
            "celsius",
            kind="gauge",
            width=6,
            min=0,
            max=100,
            thresholds=((75, "orange"), (85, "red")),
        ),
        Panel("Power usage", (Target(_per_gpu("DCGM_FI_DEV_POWER_USAGE"), GPU),), "watt", width=18),
        Panel(
            "Total power",
            (Target(f"sum({_per_gpu('DCGM_FI_DEV_POWER_USAGE')})"),),
            "watt",
            kind="gauge",
            width=6,
            min=0,
        ),
        Panel(
            "Energy used per interval",
            (
                Target(
                    f"max by (gpu) (increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{SEL}}}[$__rate_interval])) / 1000",
                    GPU,
                ),
            ),
            "joule",
            width=18,
            description="DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counts millijoules since boot.",
        ),
        stat(
            "Energy over the time range",
            f"sum(max by (gpu) (increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{SEL}}}[$__range]))) / 3.6e9",
            "kwatth",
            width=6,
            decimals=2,
        ),
        Row("Clocks and utilisation"),
        Panel(
            "SM clocks",
            (Target(f"{_per_gpu('DCGM_FI_DEV_SM_CLOCK')} * 1e6", GPU),),
            "hertz",
        ),
        Panel(
            "Memory clocks",
            (Target(f"{_per_gpu('DCGM_FI_DEV_MEM_CLOCK')} * 1e6", GPU),),
            "hertz",
        ),
        Panel(
            "GPU utilisation",
            (
                Target(_per_gpu("DCGM_FI_DEV_GPU_UTIL"), GPU),
                Target(
                    "100 * sum by (gpu) ("
                    f'max by (gpu, GPU_I_ID) (DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{SEL}, GPU_I_ID!=""}})'
                    " * on (gpu, GPU_I_ID) group_left () "
                    f"max by (gpu, GPU_I_ID) (gpupilot:device_gpu_fraction:ratio{{{SEL}}})"
                    ")",
                    "GPU {{gpu}} (MIG, slices weighted by size)",
                ),
            ),
            "percent",
            min=0,
            max=100,
            description=(
                "Whole GPUs: DCGM_FI_DEV_GPU_UTIL. MIG GPUs have no such field; their line is each "
                "instance's DCGM_FI_PROF_GR_ENGINE_ACTIVE weighted by its share of the GPU."
            ),
        ),
        Panel(
            "Tensor core activity",
            (
                Target(
                    f"100 * max by (gpu, GPU_I_PROFILE, GPU_I_ID) (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{SEL}}})",
                    "GPU {{gpu}} {{GPU_I_PROFILE}}",
                ),
            ),
            "percent",
            min=0,
            max=100,
        ),
        Panel(
            "DRAM activity",
            (
                Target(
                    f"100 * max by (gpu, GPU_I_PROFILE, GPU_I_ID) (DCGM_FI_PROF_DRAM_ACTIVE{{{SEL}}})",
                    "GPU {{gpu}} {{GPU_I_PROFILE}}",
                ),
            ),
            "percent",
            min=0,
            max=100,
        ),
        Panel(
            "Framebuffer memory used",
            (
                Target(
                    f"sum by (gpu) (max by (gpu, GPU_I_ID) (DCGM_FI_DEV_FB_USED{{{SEL}}}))",
                    GPU,
                ),
            ),
            "mbytes",
            description="MiB; on a MIG GPU, the sum over its instances.",
        ),
        Row("PCIe and errors"),
        Panel(
            "PCIe throughput",
            (
                Target(_per_gpu("DCGM_FI_PROF_PCIE_TX_BYTES"), "GPU {{gpu}} tx"),
                Target(_per_gpu("DCGM_FI_PROF_PCIE_RX_BYTES"), "GPU {{gpu}} rx"),
            ),
            "Bps",
        ),
        Panel(
            "PCIe replays",
            (
                Target(
                    f"max by (gpu) (increase(DCGM_FI_DEV_PCIE_REPLAY_COUNTER{{{SEL}}}[$__rate_interval]))",
                    GPU,
                ),
            ),
            "short",
        ),
        Panel(
            "Xid errors by code",
            (
                Target(
                    f"sum by (gpu, xid) (increase(gpupilot_xid_errors_total{{{SEL}}}[$__rate_interval]))",
                    "GPU {{gpu}} Xid {{xid}}",
                ),
            ),
            "short",
        ),
        Panel(
            "ECC and row remapping",
            (
                Target(_per_gpu("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"), "GPU {{gpu}} single-bit"),
                Target(_per_gpu("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"), "GPU {{gpu}} double-bit"),
                Target(_per_gpu("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"), "GPU {{gpu}} rows remapped"),
            ),
            "short",
        ),
        Row("MIG instances"),
        Panel(
            "Slice activity",
            (
                Target(
                    f'100 * gpupilot:slice_activity:avg5m{{{SEL}, GPU_I_ID!=""}}',
                    SLICE + " {{namespace}}/{{pod}}",
                ),
            ),
            "percent",
            min=0,
            max=100,
            description="5-minute mean of DCGM_FI_PROF_GR_ENGINE_ACTIVE per MIG instance.",
        ),
        Panel(
            "Slice framebuffer used",
            (
                Target(
                    f'max by (gpu, GPU_I_PROFILE, GPU_I_ID) (DCGM_FI_DEV_FB_USED{{{SEL}, GPU_I_ID!=""}})',
                    SLICE,
                ),
            ),
            "mbytes",
        ),
        Panel(
            "Compute processes per device",
            (
                Target(
                    f"max by (gpu, GPU_I_PROFILE, GPU_I_ID) (gpupilot_device_compute_processes{{{SEL}}})",
                    SLICE,
                ),
            ),
            "none",
            description="The idle signal on GPUs without activity counters (Ampere MIG instances).",
        ),
        Panel(
            "MIG instances and holders",
            (
                Target(
                    "max by (gpu, GPU_I_PROFILE, GPU_I_ID, placement_start, placement_size, mig_uuid) "
                    f"(gpupilot_mig_instance_info{{{SEL}}})",
                    instant=True,
                    table=True,
                ),
                Target(
                    "max by (gpu, GPU_I_PROFILE, GPU_I_ID, namespace, pod, container) "
                    f'(gpupilot_device_pod_info{{{SEL}, GPU_I_ID!=""}})',
                    instant=True,
                    table=True,
                ),
            ),
            "none",
            kind="table",
        ),
    )
    return d
