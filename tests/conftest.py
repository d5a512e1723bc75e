"""Shared pytest settings: GPU tests are marked and skipped cleanly where CUDA is absent."""
import atexit
import os
import shutil
import signal
import tempfile

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip_gpu)


# Machines are named in a file under the user's home; the tests name theirs in a file of their own
# (set before any test starts, so that every process a test starts inherits it).
if "DDPBENCH_MACHINE_FILE" not in os.environ:
    _machines = tempfile.mkdtemp(prefix="ddpbench-tests-")
    os.environ["DDPBENCH_MACHINE_FILE"] = os.path.join(_machines, "machine.json")
    atexit.register(shutil.rmtree, _machines, ignore_errors=True)


# This machine's results folder (results/runs/<machine>/: run's timing log, drift) is the tests' own as
# well: no test writes into the repository's results/, nor reads what its user measured there.
if "DDPBENCH_RESULTS" not in os.environ:
    _results = tempfile.mkdtemp(prefix="ddpbench-tests-results-")
    os.environ["DDPBENCH_RESULTS"] = _results
    atexit.register(shutil.rmtree, _results, ignore_errors=True)


# The handlers the session started with: a module-scoped fixture that changes them (one that runs
# ranks or the CLI in-process) runs before a test's own fixtures, so each test starts from these.
_HELD = {signal.SIGINT, signal.SIGTERM}
_SESSION_HANDLERS = {number: signal.getsignal(number) for number in _HELD}


@pytest.fixture(autouse=True)
def _signal_handlers_restored():
    """A test that changes the signal handlers (its own, or code it runs in-process) must not leave the
    tests after it (some interrupt their own process, as Ctrl-C does) with Ctrl-C ignored or redirected.
    Each test starts with the session's handlers and with the signals unblocked (a clean-up that holds
    them blocks them in the main thread)."""
    def reset():
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _HELD)
        for number, handler in _SESSION_HANDLERS.items():
            signal.signal(number, handler)

    reset()
    yield
    reset()
