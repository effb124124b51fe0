"""The rightsizer's one error tree; :func:`rightsizer.cli.main` catches its root once.

```
RightsizerError                   one line a user can act on; exit 1
├── InputError                    a file or flag is wrong; exit 2
│   ├── PlanError                 plan.json unreadable or inconsistent   (plan.model)
│   ├── MigPartedError            a mig-parted config is not valid       (migparted.config)
│   └── ServeConfigError          the serve schedule file is wrong       (serve.config)
├── PrometheusError               Prometheus failed                      (clients.prometheus)
│   ├── PrometheusUnavailable     not reachable / 5xx: temporary
│   └── PrometheusQueryError      the server refused a query
├── KubeError                     the Kubernetes API failed              (clients.kube)
│   ├── TemporaryKubeError        409, 429, 5xx: retry
│   └── PermanentKubeError        403, 404, 422, …: do not retry
├── ConfigMapError                the cluster's MIG ConfigMap cannot be merged (apply.configmap)
├── ApplyError                    apply cannot proceed                   (apply.settings)
└── NoInventoryError              Prometheus has no GPUs to plan for     (plan.pipeline)
```
A node whose proposal fails an internal check is not an error of the run: it is left as it is, with
the reason in the plan's notes (:func:`rightsizer.plan.build.build_plan`).
```
```
Each class lives beside the code that raises it; this module holds the roots only.
"""

from __future__ import annotations

from gpupilot_common.text import OneLineMessage


class RightsizerError(OneLineMessage):
    """Base class: ``str(err)`` is one line naming what failed and what to do."""

    exit_code = 1


class InputError(RightsizerError):
    """A file or a flag the user gave is wrong: exit 2, as for usage errors."""

    exit_code = 2
