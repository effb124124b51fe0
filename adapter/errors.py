"""The adapter's errors, each mapped to one HTTP status by the API layer.

```
AdapterError                      one line a user can act on
├── ConfigError                   the mapping file or a flag is wrong (exit 2 / keep the old config)
├── BadRequest                    400: a malformed path, selector or query parameter
├── NotFound                      404: unknown metric, or no value for the object asked about
├── Unauthorized                  401: no identity could be established
├── Forbidden                     403: the identity may not do this (SubjectAccessReview said no)
├── TooManyRequests               429: over --max-requests-inflight for too long; retry
└── UpstreamUnavailable           503: Prometheus or the Kubernetes API failed; temporary, retry
    ├── PrometheusUnavailable
    │   └── PrometheusDenied      Prometheus answered 401/403: the tenant or credentials are wrong
    └── KubernetesUnavailable
```
"""

from __future__ import annotations

from gpupilot_common.text import OneLineMessage


class AdapterError(OneLineMessage):
    """Base class: ``str(err)`` is one line naming what failed and what to do."""

    status = 500
    reason = "InternalError"


class ConfigError(AdapterError):
    status = 500
    reason = "InternalError"


class BadRequest(AdapterError):
    status = 400
    reason = "BadRequest"


class NotFound(AdapterError):
    status = 404
    reason = "NotFound"


class Unauthorized(AdapterError):
    status = 401
    reason = "Unauthorized"


class Forbidden(AdapterError):
    status = 403
    reason = "Forbidden"


class TooManyRequests(AdapterError):
    """429: more metric requests in flight than ``--max-requests-inflight`` for too long."""

    status = 429
    reason = "TooManyRequests"


class UpstreamUnavailable(AdapterError):
    """A temporary failure of a system we depend on; the HPA retries on its next sync."""

    status = 503
    reason = "ServiceUnavailable"


class PrometheusUnavailable(UpstreamUnavailable):
    pass


class PrometheusDenied(PrometheusUnavailable):
    """The backend answered 401 or 403; still 503 to the HPA (a rotated token may fix it), but the
    command-line tools stop at once with it."""


class KubernetesUnavailable(UpstreamUnavailable):
    pass
