"""gpupilot adapter: custom.metrics.k8s.io / external.metrics.k8s.io from Prometheus for the HPA."""
