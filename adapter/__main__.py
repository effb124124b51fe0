"""``python -m adapter`` = ``gpupilot-adapter``."""

import sys

from adapter.entry import main

sys.exit(main())
