"""Emulated compute: a stand-in of a model that takes the model's time without doing its work.

The stand-in has exactly the model's parameters and buffers (names, shapes, dtypes, registration
order: copied from the model built on PyTorch's meta device, so nothing is computed or allocated to
learn them). Its forward waits for the profiled forward time; its backward is a chain of autograd
nodes, one per parameter in the profiled arrival order, each waiting until its parameter's profiled
ready time and then handing autograd that parameter's gradient, so that DDP's hooks, buckets,
all-reduces and waits run unchanged - ddp_core's and PyTorch's alike. The optimizer waits for the
profiled step. This is GENIE's method (real traffic, compute replaced by waiting for its profiled
duration); with a time dilation K every wait is K times longer, as the links are K times slower
(DieCast's time warp), so that a small machine keeps up with a larger, faster one.

Waits are deadlines from the start of the phase, not sleeps of fixed length: the CPU work DDP does in
between (copies into buckets, launching all-reduces) is absorbed where the profile left time for it,
as a GPU's kernels run while the CPU launches communication. Memory per rank: the parameters, their
gradients and DDP's buckets (three times the parameter bytes; no activations).
"""
from __future__ import annotations

import time

import torch
from torch import nn

from experiments.core.profile import ComputeProfile, ComputeProfileError, Profile


class _Deadlines:
    """The clock of one backward pass: when it started, and waiting until a profiled moment after it."""

    def __init__(self, dilation: float):
        self.dilation = dilation
        self.start = 0.0

    def wait_until(self, seconds: float) -> None:
        """Sleep until `seconds` (profiled, undilated) after the start of this backward pass."""
        remaining = self.start + seconds * self.dilation - time.perf_counter()
        if remaining > 0:
            time.sleep(remaining)


class _BackwardStarts(torch.autograd.Function):
    """The loss: its backward runs first, so it marks the start of the backward pass."""

    @staticmethod
    def forward(ctx, chain, clock):
        ctx.clock = clock
        return chain.clone()

    @staticmethod
    def backward(ctx, grad):
        ctx.clock.start = time.perf_counter()
        return grad, None


class _GradientArrives(torch.autograd.Function):
    """One parameter's gradient: produced at its profiled ready time, after the gradients before it."""

    @staticmethod
    def forward(ctx, chain, param, clock, ready_s):
        ctx.clock, ctx.ready_s = clock, ready_s
        ctx.zero = torch.zeros((), dtype=param.dtype, device=param.device)
        ctx.shape = param.shape
        return chain.clone()

    @staticmethod
    def backward(ctx, grad):
        ctx.clock.wait_until(ctx.ready_s)
        # A broadcast zero: no gradient is computed; autograd adds it into the parameter's .grad
        # (kept allocated between iterations), which fires DDP's hook for this parameter.
        return grad, ctx.zero.expand(ctx.shape), None, None


class _BackwardEnds(torch.autograd.Function):
    """The start of the chain: its backward runs last and lasts until the profiled end of backward."""

    @staticmethod
    def forward(ctx, seed, clock, end_s):
        ctx.clock, ctx.end_s = clock, end_s
        return seed.clone()

    @staticmethod
    def backward(ctx, grad):
        ctx.clock.wait_until(ctx.end_s)
        return grad, None, None


class StandIn(nn.Module):
    """A model's parameters and buffers, with a forward and backward that take the profiled time.

    `wrapper` (set after wrapping in DDP) tells whether an iteration synchronises: inside `no_sync()`
    the profile's skipped-iteration times apply (no copies into buckets).
    """

    def __init__(self, layout: nn.Module, profile: Profile, dilation: float, device: torch.device):
        super().__init__()
        for name, p in layout.named_parameters():
            _put(self, name, nn.Parameter(torch.zeros(p.shape, dtype=p.dtype, device=device),
                                          requires_grad=p.requires_grad))
        for name, b in layout.named_buffers():
            _put(self, name, torch.zeros(b.shape, dtype=b.dtype, device=device), buffer=True)
        names = [n for n, _ in self.named_parameters()]
        if names != [n for n, _ in layout.named_parameters()]:
            raise RuntimeError("the stand-in's parameters are not in the model's order")  # a bug here, not the user's
        expected = [p.numel() * p.element_size() for p in self.parameters()]
        if list(profile.nbytes) != expected:
            raise ComputeProfileError(
                f"the compute profile of {profile.model!r} has {len(profile.nbytes)} gradients of "
                f"{sum(profile.nbytes)} bytes, the model has {len(expected)} of {sum(expected)}: it was profiled "
                "with another configuration of the model")
        self.profile, self.dilation, self.wrapper = profile, dilation, None
        self._seed = torch.zeros((), device=device, requires_grad=True)
        self._arrival = sorted(range(len(names)), key=profile.ready.__getitem__)

    def forward(self, *inputs, **kwargs) -> torch.Tensor:
        """Wait for the profiled forward, then return a scalar loss whose backward replays the profile."""
        started = time.perf_counter()
        sync = getattr(self.wrapper, "require_backward_grad_sync", True)
        p = self.profile
        forward_s, backward_s = (p.forward, p.backward) if sync else (p.skipped_forward, p.skipped_backward)
        scale = backward_s / p.backward if p.backward > 0 else 1.0  # no_sync: the same order, a shorter pass
        clock = _Deadlines(self.dilation)
        chain = _BackwardEnds.apply(self._seed, clock, backward_s)
        params = list(self.parameters())
        for index in reversed(self._arrival):  # built back to front: the first gradient is next to the loss
            if params[index].requires_grad:
                chain = _GradientArrives.apply(chain, params[index], clock, p.ready[index] * scale)
        loss = _BackwardStarts.apply(chain, clock)
        remaining = started + forward_s * self.dilation - time.perf_counter()
        if remaining > 0:
            time.sleep(remaining)
        return loss


class StandInOptimizer:
    """The optimizer of a stand-in: a step waits for the profiled step time; gradients stay allocated
    (zero_grad keeps them, so that autograd accumulates into them rather than allocating anew)."""

    def __init__(self, profile: Profile, dilation: float):
        self.step_s = profile.optimizer * dilation

    def step(self) -> None:
        """Take the profiled optimizer time."""
        time.sleep(self.step_s)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Keep the gradients: their values do not matter, and reusing them costs no allocation."""


def model_layout(builder) -> nn.Module:
    """The model built on the meta device: its parameters' names, shapes and dtypes, no memory."""
    with torch.device("meta"):
        return builder()


def build_stand_in(builder, compute: ComputeProfile, dilation: float, device: torch.device) -> StandIn:
    """The stand-in of the model that `builder` makes, timed by `compute`'s profile."""
    return StandIn(model_layout(builder), compute.profile, dilation, device)


def loss(model: nn.Module, batch: dict) -> torch.Tensor:
    """The stand-in's forward is its loss."""
    return model(**batch)


def make_batch(model: nn.Module, batch_size: int, image_size: int, seq_len: int, generator: torch.Generator) -> dict:
    """No input is needed: the profile's inputs are what the times stand for."""
    return {}


def _put(root: nn.Module, dotted: str, tensor: torch.Tensor, buffer: bool = False) -> None:
    """Register `tensor` under a dotted name, creating empty modules along the path."""
    *path, leaf = dotted.split(".")
    module = root
    for part in path:
        if part not in module._modules:
            module.add_module(part, nn.Module())
        module = module._modules[part]
    if buffer:
        module.register_buffer(leaf, tensor)
    else:
        module.register_parameter(leaf, tensor)
