"""`python -m ddp_launcher` is the `ddp` command."""

import sys

from .cli import main

sys.exit(main())
