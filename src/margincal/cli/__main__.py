"""``python -m margincal.cli``."""

import sys

from margincal.cli import main

sys.exit(main())
