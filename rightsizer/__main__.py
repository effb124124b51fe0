"""``python -m rightsizer`` = ``gpupilot-rightsizer``."""

import sys

from rightsizer.entry import main

sys.exit(main())
