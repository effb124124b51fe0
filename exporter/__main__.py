"""``python -m exporter`` = ``gpupilot-exporter``."""

from exporter.commands.cli import main

raise SystemExit(main())
