"""One gradient bucket: a flat buffer that its parameters' gradients are packed into.

The class offers the methods of PyTorch's `torch.distributed.GradBucket` (`index`, `buffer`,
`gradients`, `parameters`, `is_last`, `set_buffer`), so communication hooks written for PyTorch's DDP,
including those in `torch.distributed.algorithms.ddp_comm_hooks`, run unchanged on ddp_core.
"""
from __future__ import annotations

import torch


class GradBucket:
    """A flat gradient buffer over a few parameters, plus what the reducer tracks about it."""

    def __init__(self, index: int, params: list[torch.nn.Parameter], param_indices: list[int], is_last: bool,
                 sparse: bool = False):
        first = params[0]
        self._index = index
        self._params = params
        self.param_indices = param_indices  # positions in the reducer's parameter list
        self._is_last = is_last
        # A sparse bucket holds one parameter and no storage: its gradient itself becomes the buffer.
        self.sparse = sparse
        self.flat: torch.Tensor | None = None
        self.views: list[torch.Tensor] = []
        if not sparse:
            numels = [p.numel() for p in params]
            # The reducer's own storage; `views[i]` is parameter i's gradient inside it.
            self.flat = torch.zeros(sum(numels), dtype=first.dtype, device=first.device)
            self.views = [chunk.view_as(p) for chunk, p in zip(self.flat.split(numels), params)]
        self._buffer = self.flat
        self.pending = len(params)  # gradients not yet ready in this backward
        self.future: torch.futures.Future | None = None

    # --- PyTorch's GradBucket interface, used by communication hooks ---

    def index(self) -> int:
        """Position of this bucket in launch order; bucket 0 is reduced first."""
        return self._index

    def buffer(self) -> torch.Tensor:
        """The flat tensor the hook should reduce (a hook may have replaced it with `set_buffer`)."""
        return self._buffer

    def gradients(self) -> list[torch.Tensor]:
        """Each parameter's gradient, as a view into the flat storage (a sparse bucket: its gradient)."""
        return [self._buffer] if self.sparse else list(self.views)

    def parameters(self) -> list[torch.nn.Parameter]:
        """The parameters whose gradients this bucket holds."""
        return list(self._params)

    def is_last(self) -> bool:
        """True for the last bucket reduced in an iteration (PowerSGD counts iterations with it)."""
        return self._is_last

    def set_buffer(self, buffer: torch.Tensor) -> None:
        """Replace the tensor that `buffer()` returns, as compression wrappers do before reducing."""
        self._buffer = buffer

    # --- used by the reducer ---

    def start_iteration(self) -> None:
        """Forget the previous iteration's readiness and any buffer a hook put in place."""
        self.pending = len(self._params)
        self.future = None
        self._buffer = self.flat


def empty_sparse_like(param: torch.Tensor) -> torch.Tensor:
    """A sparse gradient with no entries, shaped like `param`'s (what a rank that did not use it sends)."""
    return torch.sparse_coo_tensor(
        torch.empty(1, 0, dtype=torch.int64, device=param.device),
        torch.empty((0, *param.shape[1:]), dtype=param.dtype, device=param.device),
        param.shape,
    )
