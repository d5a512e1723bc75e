"""Shared pytest settings: GPU tests are marked and skipped cleanly where CUDA is absent."""
import atexit
import os
import shutil
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
