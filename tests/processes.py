"""What the tests of runs, faults and links share about processes: waiting for a condition, whether a
process still lives, the namespaces a run created, and a stand-in workload that crashes and hangs."""
import os
import time

from experiments.core.procfs import process_lives as alive  # (the tests' name for it)
from experiments.emulate import network


def wait_for(condition, seconds: float = 120.0) -> None:
    """Poll `condition` until it holds; fail the test after `seconds`."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def namespaces_of(pid: int) -> list[str]:
    """The network namespaces that the run of process `pid` created (their names carry its pid)."""
    return network.list_netns(f"{network.PREFIX}{pid}-")


def flaky_measure(rank, world_size, fields):
    """A stand-in workload: config 1 crashes on rank 1, config 2 hangs on rank 0, the others succeed."""
    job = fields["seed"]
    if job == 1 and rank == 1:
        raise RuntimeError("injected failure")
    if job == 2 and rank == 0:
        time.sleep(3600)
    import torch.distributed as dist
    dist.barrier()
    return {"rank": rank, "pid": os.getpid()}


def burn_cpu(rank, world_size, seconds):
    """Keep one core busy for `seconds` of this process's CPU time; return the CPU seconds it used."""
    started = time.process_time()
    while time.process_time() - started < seconds:
        pass
    return time.process_time() - started


def rank_facts(rank, world_size, name):
    """Print a line to standard output and one to standard error; return the pid, the parent's pid and
    the environment variable `name`."""
    import sys
    print(f"rank {rank} says hello on stdout", flush=True)
    print(f"rank {rank} says hello on stderr", file=sys.stderr, flush=True)
    return os.getpid(), os.getppid(), os.environ.get(name)
