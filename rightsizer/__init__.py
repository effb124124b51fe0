"""gpupilot rightsizer: Prometheus history → idle MIG slices → better layouts → MIG Manager.

Packages by role, each importing only the ones below it (an import-linter ``layers`` contract):

=============  ==================================================================
``cli``        the ``gpupilot-rightsizer`` entry point
``commands/``  one module per subcommand (validate, plan, apply, report, serve)
``serve/``     the schedule's configuration and the APScheduler service
``report/``    the weekly report: data, charts, HTML/Markdown rendering
``apply/``     the MIG Manager label protocol, config writing, dry run
``plan/``      the plan.json contract, building it, the pipeline, its tables
``optimise/``  pure packing and per-node/pooled proposals
``analysis/``  Prometheus history → per-device usage; the plain data it hands on
``clients/``   the doors to Kubernetes and Prometheus
``migparted/`` NVIDIA's config formats (mig-parted, device-plugin time-slicing)
=============  ==================================================================
"""
