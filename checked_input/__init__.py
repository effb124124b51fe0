"""Checked input shared by the three services (which may not import each other).

* :mod:`checked_input.numbers` — argparse types for numbers: finite, in range, one-line errors.
* :mod:`checked_input.cli` — an argparse parser whose errors are one line and exit status 2.
* :mod:`checked_input.yamlsafe` — YAML loading with bounded aliases, depth and size.
* :mod:`checked_input.urls` — URLs as they may be shown: user-info redacted.
* :mod:`checked_input.text` — error messages kept to one line of bounded length.

Depends on nothing of the project (an import-linter contract says so).
"""
