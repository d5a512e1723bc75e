"""Runs PyTorch's own DDP tests, shipped inside the installed torch, with DDP optionally swapped for ddp_core.

Nothing is copied from PyTorch: this module only makes the test base class that ships in
`torch.testing._internal.distributed.distributed_test` runnable (PyTorch's own repository does the same
in test/distributed/test_distributed_spawn.py) and, when DDPBENCH_DDP=ddp_core, puts ddp_core's
DistributedDataParallel where the tests look for PyTorch's. Each test spawns its rank processes, which
import this module again, so the swap holds in every rank.

    DDPBENCH_DDP=ddp_core python -m pytest tests/pytorch_suite/driver.py -k test_ddp_join
"""
import os
import sys
from pathlib import Path

# Gloo on the CPU, two ranks, loopback only; the tests rendezvous through a file, not a TCP port.
os.environ.setdefault("BACKEND", "gloo")
os.environ.setdefault("WORLD_SIZE", "2")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

import torch.nn.parallel  # noqa: E402

IMPLEMENTATION = os.environ.get("DDPBENCH_DDP", "torch")
if IMPLEMENTATION == "ddp_core":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    import ddp_core  # noqa: E402

    # Before the test module is imported: it binds the name at import time.
    torch.nn.parallel.DistributedDataParallel = ddp_core.DistributedDataParallel
elif IMPLEMENTATION != "torch":
    raise SystemExit(f"DDPBENCH_DDP={IMPLEMENTATION!r}: must be 'torch' or 'ddp_core'")

from torch.testing._internal.common_utils import run_tests  # noqa: E402
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)


class TestPyTorchDDPSuite(TestDistBackend, DistributedTest._DistTestBase):
    """PyTorch's distributed test base, spawning its ranks for every test."""

    def setUp(self):
        super().setUp()
        self._spawn_processes()


if __name__ == "__main__":
    run_tests()
