"""`python -m experiments ...` is the same as `ddpbench ...`."""
import signal
import sys

from experiments.cli import EXIT_INTERRUPTED, main

status = main()
if status == EXIT_INTERRUPTED:
    # Stopping after Ctrl-C: another Ctrl-C (a user pressing it again) must not break the exit half-way
    # (atexit handlers flushing records and removing what the run made).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
sys.exit(status)
