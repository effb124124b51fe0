import sys

from rightsizer.cli import main

sys.exit(main())
