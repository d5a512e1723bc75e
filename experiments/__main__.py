"""`python -m experiments ...` is the same as `ddpbench ...`."""
from experiments.cli import entry_point

entry_point()
