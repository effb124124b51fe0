"""gpupilot exporter: NVML/GPM (or the simulator) → DCGM-compatible Prometheus metrics."""
