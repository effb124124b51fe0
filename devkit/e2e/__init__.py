"""``make e2e``: the rendered manifests run from the built images on this machine.

The chart (defaults, auto-apply on, external metrics and KEDA's scaler on) and the kustomize
overlays are rendered; each rendered workload's container runs from its image
(``dist/images/*.oci.tar``; ``buildah from`` + ``buildah run --isolation chroot``, which shares the
host's loopback) with exactly the rendered command, args and env, its ConfigMaps and Secrets as files
at their mount paths with the modes Kubernetes gives them, a service-account token and CA for the
Kubernetes API double (standing in for the kube-apiserver and its aggregation layer), and the pod's
user. A real Prometheus scrapes the simulator where the exporter's ServiceMonitor points. Each check
prints one line; a summary ends the run. What it cannot show: a real kube-apiserver, kubelet or GPU.
"""
