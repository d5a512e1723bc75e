"""How much memory a rank needs: its peak over the measured iterations of one config, and what a replica
of a model holds once it has trained (the atlas's memory per option).

On CUDA the figures are PyTorch's caching allocator's (`max_memory_allocated` after a reset, and
`memory_allocated`): the tensors themselves, not what the allocator keeps cached. On the CPU there is no
such counter, so they are the process's resident set, which Linux keeps a peak of (VmHWM in
/proc/self/status). A rank process measures config after config, so its lifetime peak (getrusage's
ru_maxrss) would carry one config's peak into the next; writing "5" to /proc/self/clear_refs resets the
peak to the current resident set (Linux >= 4.0), which makes it a peak per config. Where that file cannot
be written the peak is the process's since it started, and the record's `method` says so.

tests/unit/test_memory.py and tests/integration/test_memory.py check both against allocations of known size.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import resource
from pathlib import Path

import torch

MB = 2**20
CLEAR_REFS = Path("/proc/self/clear_refs")
STATUS = Path("/proc/self/status")
METHODS = {"cuda": "torch.cuda.max_memory_allocated, reset per config",
           "hwm": "peak resident set (VmHWM), reset per config through /proc/self/clear_refs",
           "ru_maxrss": "peak resident set since the rank process started (getrusage; /proc/self/clear_refs "
                        "could not be written): an upper bound for this config"}


def _status_kb(field: str) -> int | None:
    """A `kB` field of /proc/self/status (VmRSS, VmHWM), None where there is no such file (not Linux)."""
    try:
        for line in STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


@functools.cache
def _malloc_trim():
    """glibc's malloc_trim, or None (another C library): returns freed heap memory to the system."""
    name = ctypes.util.find_library("c")
    function = getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    if function is not None:
        function.argtypes, function.restype = [ctypes.c_size_t], ctypes.c_int
    return function


class PeakMemory:
    """The peak memory of this process on `device` between `reset()` and `read()`."""

    def __init__(self, device: torch.device):
        self.device = device
        self.method = "cuda" if device.type == "cuda" else "hwm"

    def reset(self) -> None:
        """Start a new peak here: the next `read` reports the largest figure from now on."""
        if self.method == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        try:
            CLEAR_REFS.write_text("5")
        except OSError:  # not Linux, or a kernel or sandbox that refuses it
            self.method = "ru_maxrss"

    def read(self) -> dict:
        """{"peak_mb", "method"}: the peak since `reset`, in MiB, and how it was measured (METHODS)."""
        if self.method == "cuda":
            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device) / MB
        else:
            hwm = _status_kb("VmHWM") if self.method == "hwm" else None
            if hwm is None:
                self.method = "ru_maxrss"
                hwm = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kB on Linux
            peak = hwm / 1024
        return {"peak_mb": peak, "method": self.method}


def held_mb(device: torch.device) -> float:
    """The memory this process holds now, in MiB: on CUDA the allocated tensors; on the CPU the resident set
    after freed heap memory is handed back (malloc_trim), so that what an earlier iteration freed but the
    allocator kept does not count as held."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return torch.cuda.memory_allocated(device) / MB
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
    rss = _status_kb("VmRSS")
    if rss is None:
        raise RuntimeError("the memory held is measured from /proc/self/status, which this system lacks")
    return rss / 1024



def released_by(drop, device: torch.device) -> float:
    """The MiB this process holds less after `drop()` (which deletes the last references to something) and a
    garbage collection: what that thing held. Measured by deleting rather than by building, because the
    first replica a process builds also pays its one-time costs (thread pools, the communication
    library's buffers), which are not the replica's and are not given back."""
    before = held_mb(device)
    drop()
    gc.collect()
    return before - held_mb(device)

