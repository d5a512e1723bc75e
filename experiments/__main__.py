"""`python -m experiments ...` is the same as `ddpbench ...`."""
import sys

from experiments.cli import main

sys.exit(main())
