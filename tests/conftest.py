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


@pytest.fixture(autouse=True)
def _signal_handlers_restored():
    """The CLI's main() installs a SIGTERM handler and, once interrupted, ignores SIGINT for its exit: a
    test that calls it in-process must not leave the tests after it (some interrupt their own process,
    as Ctrl-C does) with Ctrl-C ignored."""
    held = {signal.SIGINT, signal.SIGTERM}
    saved = {number: signal.getsignal(number) for number in held}
    # (and the main thread's signal mask: a clean-up that holds these signals blocks them there, and a
    # test that interrupts its own process would otherwise wait for a signal that never arrives)
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, held)
    yield
    signal.pthread_sigmask(signal.SIG_SETMASK, mask - held)
    for number, handler in saved.items():
        signal.signal(number, handler)
