"""`python -m ddp_train ...` (with train/ on PYTHONPATH): the same program as train/train.py."""

import sys

from . import cli

if (answered := cli.main(sys.argv[1:])) is not None:
    sys.exit(answered)
from .main import exit_with, main

exit_with(main())
