"""Shared test doubles and helpers: the Kubernetes API double (``kubedouble``), fake NVML, kubelet double, PKI, histories and HTTP clients, by the area that first needed them."""
