"""The Kubernetes HorizontalPodAutoscaler controller's decision as pure functions (shared: the
adapter's explain-hpa, replay-hpa and recommend-hpa, and the simulator's autoscaled services)."""
