"""Errors of the exporter.

    ExporterError
    ├── BackendError            a read failed; the collection is abandoned, the last snapshot stays
    │   └── BackendUnavailable  the backend could not start (NVML init); retried with backoff
    └── ConfigError             bad input (scenario, web config, flags): one line, exit 2; not retried
        └── ScenarioError

``temporary`` on an instance tells the collection loop whether retrying can help.
"""

from __future__ import annotations

from gpupilot_common.text import OneLineMessage


class ExporterError(OneLineMessage):
    temporary = False


class BackendError(ExporterError):
    temporary = True


class BackendUnavailable(BackendError):
    pass


class ConfigError(ExporterError):
    """Bad input; ``str(e)`` is one line naming the file, field and what to do."""


class ScenarioError(ConfigError):
    pass
