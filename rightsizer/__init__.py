"""gpupilot rightsizer: Prometheus history → idle MIG slices → better layouts → MIG Manager."""
