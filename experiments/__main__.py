"""`python -m experiments ...` is the same as `ddpbench ...`."""
import sys

from .cli import main

sys.exit(main())
