"""Mixed precision for the measured step (`--amp none|bf16|fp16`), as models are trained on GPUs.

Forward (the workload's loss) runs under autocast in the chosen dtype; backward follows the dtypes
forward chose, and parameters, gradients and DDP's buckets stay float32. float16's narrow range needs
a gradient scaler: the loss is scaled before backward, and the optimizer step unscales the gradients
and skips a step whose gradients overflowed (a device sync each step: part of what fp16 costs). bfloat16
has float32's range and needs none.
"""
from __future__ import annotations

import contextlib

import torch

DTYPES = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}


class Precision:
    """Autocast, loss scaling and the optimizer step for one `--amp` setting on one device."""

    def __init__(self, amp: str = "none", device: torch.device | str = "cpu"):
        if amp not in DTYPES:
            raise ValueError(f"amp={amp!r} is not allowed; choose one of {', '.join(DTYPES)}")
        self.amp, self.dtype = amp, DTYPES[amp]
        self.device_type = torch.device(device).type
        self.scaler = torch.amp.GradScaler(self.device_type) if amp == "fp16" else None

    def autocast(self) -> contextlib.AbstractContextManager:
        """The context forward runs in: autocast to the dtype, or nothing for `none`."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of the (scaled, with fp16) loss."""
        (loss if self.scaler is None else self.scaler.scale(loss)).backward()

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """The optimizer step (with fp16: unscale, skip on overflow, adapt the scale)."""
        if self.scaler is None:
            optimizer.step()
        else:
            self.scaler.step(optimizer)
            self.scaler.update()


FULL = Precision("none")  # float32 throughout: what every run did before --amp
