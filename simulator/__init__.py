"""The fleet simulator: a deterministic, time-driven GPU fleet behind the exporter's backend protocol.

``scenario`` loads a YAML fleet, ``patterns`` and ``values`` turn it into numbers as pure functions
of (seed, entity, time), ``backend.SimBackend`` serves one node's snapshots, ``cluster`` what a
cluster around it would publish (kube-state-metrics, application series), and ``backfill`` writes
weeks of the same values as TSDB blocks.
"""
