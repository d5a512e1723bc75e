"""Bad use fails fast with a clear message, never a hang; the launcher ends crashed and hung runs."""

import pytest
import torch
from torch import nn

import ddp_core
from ddp_core import DistributedDataParallel


@pytest.mark.parametrize("kwargs, needle", [
    ({"bucket_cap_mb": -1}, "bucket_cap_mb=-1 is not allowed: it must be a number of MB >= 0.*or \"auto\""),
    ({"first_bucket_cap_mb": -0.5}, "first_bucket_cap_mb must be a number >= 0.*-0.5"),
    ({"bucket_cap_mb": "25"}, "bucket_cap_mb.*'25'"),
])
def test_bad_bucket_caps_are_rejected_before_any_communication(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        DistributedDataParallel(nn.Linear(2, 2), **kwargs)


def test_module_without_trainable_parameters_is_rejected():
    frozen = nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(ValueError, match="no parameters that require gradients"):
        DistributedDataParallel(frozen)


def test_wrapping_before_init_process_group_is_a_clear_error():
    with pytest.raises(RuntimeError, match="init_process_group"):
        DistributedDataParallel(nn.Linear(2, 2))


@pytest.mark.parametrize("backend, device, needle", [
    ("nccl", "cpu", "nccl.*CUDA"),
    ("ucc", "cpu", "'ucc' is not supported"),
    ("gloo", "tpu", "'tpu' is not supported"),
])
def test_check_backend_names_the_problem(backend, device, needle):
    with pytest.raises(ValueError, match=needle):
        ddp_core.check_backend(backend, device)


def test_mpi_is_checked_against_this_torch_build():
    if torch.distributed.is_mpi_available():
        ddp_core.check_backend("mpi", "cpu")
    else:
        with pytest.raises(ValueError, match="'mpi' is not available"):
            ddp_core.check_backend("mpi", "cpu")
