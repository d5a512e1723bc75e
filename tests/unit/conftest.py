"""The unit tests start no ranks: no process group, no rank process (a quick `git` or CLI child is fine).
A test that needs ranks belongs in tests/integration/; this keeps the unit part fast and honest."""
import multiprocessing.process

import pytest
import torch.distributed


def _refuse(what):
    def refused(*args, **kwargs):
        raise AssertionError(f"a unit test started {what}; tests that need ranks belong in tests/integration/")
    return refused


@pytest.fixture(autouse=True)
def _no_ranks(monkeypatch):
    """Refuse a process group or a multiprocessing child for the length of each unit test."""
    monkeypatch.setattr(torch.distributed, "init_process_group", _refuse("a process group"))
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", _refuse("a process"))
