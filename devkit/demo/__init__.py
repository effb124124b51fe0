"""``make demo``: a simulated GPU fleet, a real Prometheus, the adapter and the rightsizer, on one machine.

``python -m devkit.demo`` backfills history, starts the services, shows the fleet, what the HPA
would do, the rightsizing plan and report, then waits for Ctrl-C (or exits with ``DEMO_EXIT=1``).
"""
