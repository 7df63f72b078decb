"""`python -m ddp_train ...` (with train/ on PYTHONPATH): the same program as train/train.py."""

from .main import exit_with, main

exit_with(main())
