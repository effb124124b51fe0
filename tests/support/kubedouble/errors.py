"""The double's API errors: a Kubernetes ``Status`` object with its HTTP code."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        *,
        details: dict[str, Any] | None = None,
        retry_after_s: int | None = None,
    ) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details or {}
        self.retry_after_s = retry_after_s
        if retry_after_s is not None:  # apimachinery: details.retryAfterSeconds + a Retry-After header
            self.details = {**self.details, "retryAfterSeconds": retry_after_s}

    def status(self) -> dict[str, Any]:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "details": self.details,
            "code": self.code,
        }


REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    409: "Conflict",
    410: "Expired",
    413: "RequestEntityTooLarge",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}
"""metav1.StatusReason for each code, as ``k8s.io/apimachinery/pkg/api/errors`` names them."""
