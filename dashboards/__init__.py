"""Grafana dashboards for gpupilot, generated from typed Python (``make dashboards``).

The committed ``dashboards/*.json`` files are what users import; ``dashboards.build`` rewrites them
and ``tests/dashboards`` checks they match, that their structure is sound and that every panel's
query returns data on a real Prometheus over simulated history.
"""
