"""``python -m adapter`` = ``gpupilot-adapter``."""

import sys

from adapter.cli import main

sys.exit(main())
