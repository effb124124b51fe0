"""The one door to a chat or HTTP webhook: POST one JSON document, bounded in time and answer size.

The URL comes from a file (a mounted Secret, re-read at each push so a rotated URL is used) and is
never shown: a Slack or Teams webhook URL is itself the credential. Errors name the file, not the URL."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from gpupilot_common import yamlsafe
from gpupilot_common.paths import file_problem
from rightsizer.errors import RightsizerError

MAX_URL_BYTES = 4096
MAX_ANSWER_BYTES = 64 * 1024


class WebhookError(RightsizerError, RuntimeError):
    """The webhook could not be reached or refused the message; one line, without the URL."""


def read_url(path: Path) -> str:
    """The webhook URL held in ``path`` (one line); :class:`WebhookError` when unusable."""
    if problem := file_problem(path):
        raise WebhookError(f"webhook URL file {path}: {problem}")
    try:
        text = yamlsafe.read_bytes(path, max_bytes=MAX_URL_BYTES + 64).decode("utf-8", "replace").strip()
    except OSError as exc:
        raise WebhookError(f"webhook URL file {path}: {exc.strerror or exc}") from None
    if (
        len(text) > MAX_URL_BYTES
        or not text.startswith(("https://", "http://"))
        or any(c.isspace() for c in text)
    ):
        raise WebhookError(f"webhook URL file {path}: not one http(s) URL")
    return text


def post(url_file: Path, document: dict[str, Any], *, timeout_s: float = 10.0) -> None:
    """POST ``document`` as JSON to the URL in ``url_file``; a 2xx answer is success."""
    url = read_url(url_file)
    body = json.dumps(document).encode()
    request = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", "User-Agent": "gpupilot-rightsizer"},
    )
    where = f"webhook (URL from {url_file})"
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:
            answer.read(MAX_ANSWER_BYTES)
    except urllib.error.HTTPError as exc:
        raise WebhookError(f"{where} answered HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        reason = getattr(exc, "reason", exc)
        raise WebhookError(f"{where} unreachable: {reason}") from None
