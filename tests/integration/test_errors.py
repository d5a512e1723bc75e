"""Bad use fails fast with a clear message, never a hang; the launcher ends crashed and hung runs."""
import time

import pytest
import torch
from torch import nn

import ddp_core
from ddp_core import DistributedDataParallel
from experiments.measure.launch import RankFailed, RanksTimedOut, run_ranks
from tests.tiny_models import build, loss_of, make_batch


def different_models(rank, world_size):
    DistributedDataParallel(nn.Linear(4, 4 + rank))


def unused_without_flag(rank, world_size):
    ddp = DistributedDataParallel(build("branchy"))
    loss_of(ddp, "branchy", make_batch("branchy", 0, 0)).backward()


def misuse_checks(rank, world_size):
    """Errors that need a process group: each must raise on this rank, not hang."""
    errors = {}
    ddp = DistributedDataParallel(nn.Linear(3, 3))
    with pytest.raises(TypeError, match="hook must be callable") as e:  # PyTorch's DDP raises TypeError too
        ddp.register_comm_hook(None, "allreduce")
    errors["hook"] = str(e.value)
    # A forward whose output gets no backward is forgotten, as in PyTorch's DDP: the next one synchronises.
    ddp(torch.randn(2, 3))
    ddp(torch.ones(2, 3) * (rank + 1)).sum().backward()
    grads = [p.grad.clone() for p in ddp.parameters()]
    for grad in grads:
        torch.distributed.broadcast(grad, src=0)
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, ddp.parameters())), "ranks disagree"
    with pytest.raises(ValueError, match="count must be an integer >= 1, got 0"):
        ddp_core.new_round_robin_groups(0)
    return errors


def failing_hook_then_training_goes_on(rank, world_size):
    """A hook whose future fails: backward raises its error, and the next iteration trains as usual."""
    torch.manual_seed(0)
    ddp = DistributedDataParallel(nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3)), bucket_cap_mb=0)
    calls = []

    def hook(state, bucket):
        calls.append(bucket.index())
        if len(calls) == 1:  # the first bucket of the first backward
            failed = torch.futures.Future()
            failed.set_exception(RuntimeError("hook failed on purpose"))
            return failed
        return ddp_core.allreduce_hook(state, bucket)

    ddp.register_comm_hook(None, hook)
    with pytest.raises(RuntimeError, match="hook failed on purpose"):
        ddp(torch.ones(2, 3)).sum().backward()
    ddp(torch.ones(2, 3) * (rank + 1)).sum().backward()  # would hang or mismatch after a half-done backward
    grads = [p.grad.clone() for p in ddp.parameters()]
    for grad in grads:
        torch.distributed.broadcast(grad, src=0)
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, ddp.parameters())), "ranks disagree"
    return len(calls)


# A timeout far above the ranks' start-up even on a busy machine: an error that comes at once comes well
# before half of it, one that waits for it after (the bounds below are relative to it, not to a quiet machine).
LONG_TIMEOUT = 240


@pytest.mark.timeout(LONG_TIMEOUT + 60)
def test_a_failing_comm_hook_raises_and_leaves_nothing_half_done():
    assert run_ranks(failing_hook_then_training_goes_on, 2, timeout=LONG_TIMEOUT) == [8, 8]  # 4 buckets, 2 backwards


@pytest.mark.timeout(LONG_TIMEOUT + 60)
def test_different_models_on_ranks_fail_naming_the_mismatch():
    with pytest.raises(RankFailed, match=r"different models \(parameter 0: .*\(4, 4\).* on rank 0, .*\(5, 4\).* on rank 1"):
        run_ranks(different_models, 2, timeout=LONG_TIMEOUT)


@pytest.mark.timeout(LONG_TIMEOUT + 60)
def test_unused_parameters_without_the_flag_name_them_instead_of_hanging():
    start = time.monotonic()
    with pytest.raises(RankFailed, match=r"received no gradient.*branches\.1\.weight.*never\.weight.*find_unused_parameters=True"):
        run_ranks(unused_without_flag, 2, timeout=LONG_TIMEOUT)
    assert time.monotonic() - start < LONG_TIMEOUT / 2, "the error came only after a timeout"


@pytest.mark.timeout(LONG_TIMEOUT + 60)
def test_misuse_inside_a_process_group_raises():
    run_ranks(misuse_checks, 2, timeout=LONG_TIMEOUT)


def crash_on_rank_1(rank, world_size):
    if rank == 1:
        raise ZeroDivisionError("boom on purpose")
    torch.distributed.barrier()  # rank 0 would wait here forever


def hang(rank, world_size):
    time.sleep(3600)


@pytest.mark.timeout(LONG_TIMEOUT + 60)
def test_launcher_reports_a_crashed_rank_at_once():
    start = time.monotonic()
    with pytest.raises(RankFailed, match=r"rank 1 of 2 raised:(.|\n)*ZeroDivisionError: boom on purpose"):
        run_ranks(crash_on_rank_1, 2, timeout=LONG_TIMEOUT)
    assert time.monotonic() - start < LONG_TIMEOUT / 2, "the crash was reported only after a timeout"


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_launcher_ends_a_hung_run_within_the_timeout():
    start = time.monotonic()
    with pytest.raises(RanksTimedOut, match=r"rank\(s\) \[0, 1\] did not finish within 15 s"):
        run_ranks(hang, 2, timeout=15)
    assert time.monotonic() - start < 40
