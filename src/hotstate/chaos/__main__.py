"""`python -m hotstate.chaos`: run chaos schedules (hotstate.chaos.run)."""

import sys

from hotstate.chaos.run import main

sys.exit(main())
