"""``python -m exporter`` = ``gpupilot-exporter``."""

from exporter.entry import main

raise SystemExit(main())
