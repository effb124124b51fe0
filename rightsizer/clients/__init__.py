"""The rightsizer's doors to outside systems: Kubernetes and Prometheus."""
