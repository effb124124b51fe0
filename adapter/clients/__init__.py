"""The adapter's doors to outside systems: the Prometheus HTTP API (``prometheus``) and the Kubernetes API (``kube``). Nothing else in the adapter talks to either."""
