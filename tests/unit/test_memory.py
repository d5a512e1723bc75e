"""Peak memory per rank: the instrument against allocations of known size, then a `run` record of a model
that allocates a known amount per iteration, then the figure where users read it."""
import mmap

import pytest
import torch

from experiments.measure.memory import PeakMemory, held_mb

CPU = torch.device("cpu")
MB = 2**20


def _touch(mb: int) -> torch.Tensor:
    """A float32 tensor of `mb` MiB whose every page is written (an untouched allocation is not resident)."""
    return torch.ones(mb * MB // 4)


def _fresh_pages(mb: int) -> None:
    """Map `mb` MiB, write every page, unmap them: new resident pages whatever the process ran before
    (malloc may serve a freed tensor's still-resident memory to a small one, which the peak rightly
    does not count, so a tensor is no ground truth here)."""
    region = mmap.mmap(-1, mb * MB)
    pages = torch.frombuffer(region, dtype=torch.uint8)
    pages.fill_(1)
    del pages  # the buffer's last export: the region can now be unmapped
    region.close()


def test_the_peak_rises_by_an_allocation_of_known_size_and_resets():
    peak = PeakMemory(CPU)
    for mb in (32, 256):
        peak.reset()
        before = peak.read()["peak_mb"]
        _fresh_pages(mb)  # allocated, written, freed at once: only the peak keeps it
        reading = peak.read()
        assert reading["method"] == "hwm"
        assert reading["peak_mb"] - before == pytest.approx(mb, abs=2)
    # after a reset, an earlier larger peak no longer counts
    peak.reset()
    start = peak.read()["peak_mb"]
    _fresh_pages(16)
    assert peak.read()["peak_mb"] - start == pytest.approx(16, abs=2)


def test_the_memory_held_counts_a_kept_tensor_and_not_a_freed_one():
    start = held_mb(CPU)
    kept = _touch(64)
    assert held_mb(CPU) - start == pytest.approx(64, abs=2)
    del kept
    assert held_mb(CPU) - start == pytest.approx(0, abs=2)
