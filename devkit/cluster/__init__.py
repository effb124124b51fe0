"""A real Kubernetes control plane for the tests, the e2e and the demo, built from upstream's Go
modules (:mod:`devkit.gobuild`): etcd, kube-apiserver, kube-controller-manager, kube-scheduler and
KWOK on loopback (:mod:`.controlplane`), simulated GPU nodes from a simulator scenario
(:mod:`.nodes`, :mod:`.deviceplugin`), and a MIG Manager stand-in acting through the real API
(:mod:`.migmanager`, :mod:`.migconfig`). ``python -m devkit.cluster up`` runs one until Ctrl-C.
"""

from devkit.cluster.controlplane import ClusterError, ControlPlane, Settings

__all__ = ["ClusterError", "ControlPlane", "Settings"]
