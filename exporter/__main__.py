"""``python -m exporter`` = ``gpupilot-exporter``."""

from exporter.cli import main

raise SystemExit(main())
