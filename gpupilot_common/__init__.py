"""Code shared by the three services, which may not import each other: pure helpers, no service logic.

* :mod:`gpupilot_common.timefmt` — durations in Prometheus' grammar, times in RFC 3339, bounds.
* :mod:`gpupilot_common.checked` — checked input: ``file:line: field.path: problem``, one line.
* :mod:`gpupilot_common.yamlsafe` — YAML loading with bounded aliases, depth and size.
* :mod:`gpupilot_common.numbers` — argparse types for numbers: finite, in range, one-line errors.
* :mod:`gpupilot_common.cli` — an argparse parser whose errors are one line and exit status 2.
* :mod:`gpupilot_common.urls` — URLs as they may be shown: user-info redacted.
* :mod:`gpupilot_common.text` — error messages kept to one line of bounded length.
* :mod:`gpupilot_common.httpbase` — the bounded aiohttp loop server both HTTP servers build on.
* :mod:`gpupilot_common.httpserve` — a bounded aiohttp server for small GET endpoints.

Depends on nothing of the project (an import-linter contract says so).
"""
