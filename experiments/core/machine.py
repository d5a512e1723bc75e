"""The machine a measurement runs on: its name, its environment (stored in every record), how busy its
cores are, and whether ranks run under torchrun."""
from __future__ import annotations

import os
import platform
import resource
import socket
import time
from pathlib import Path

from experiments.core.git import git_or_empty


def under_torchrun() -> bool:
    """Whether this process is a rank started by torchrun (or another launcher that sets RANK/WORLD_SIZE)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def busy_cpu_seconds() -> float | None:
    """CPU seconds the whole machine has spent busy so far (/proc/stat: all but idle and iowait), or
    None where /proc/stat is missing."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return None
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def cpu_seconds() -> tuple[float, float] | None:
    """CPU seconds used so far by every process on the machine (/proc/stat) and by this process's
    finished children; None where /proc/stat is missing."""
    busy = busy_cpu_seconds()
    if busy is None:
        return None
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return busy, children.ru_utime + children.ru_stime


def other_cores_busy(before: tuple[float, float] | None, after: tuple[float, float] | None,
                     wall: float) -> float | None:
    """The cores that processes other than this one's children kept busy on average between two
    cpu_seconds() readings `wall` seconds apart; None where /proc/stat is missing."""
    if before is None or after is None:
        return None
    return max(0.0, (after[0] - before[0]) - (after[1] - before[1])) / wall


def environment(threads: int | None = None) -> dict:
    """Where and with what a record was measured: commit, versions, host, CPU, GPU, threads, time."""
    import torch

    def git(*args: str) -> str:
        return git_or_empty(*args, cwd=Path(__file__).resolve().parent)

    cuda = torch.cuda.is_available()
    nccl = torch.cuda.nccl.version() if cuda else None
    return {
        "git_commit": git("rev-parse", "HEAD") or None,
        "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl,
        "python": platform.python_version(),
        "host": socket.gethostname(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "gpu_count": torch.cuda.device_count() if cuda else 0,
        "threads_per_rank": threads,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def machine_name() -> str:
    """A short name for this kind of machine, used to key stored results: arch, cores, GPU."""
    import torch

    name = f"{platform.machine()}-{os.cpu_count()}cpu"
    if torch.cuda.is_available():
        gpu = torch.cuda.get_device_name(0).replace("NVIDIA ", "").replace(" ", "_")
        name += f"-{torch.cuda.device_count()}x{gpu}"
    return name


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
