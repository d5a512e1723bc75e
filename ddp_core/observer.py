"""What an observer of the reducer is told during backward: the harness's timeline, the performance
model's profile and the bucket-cap tuner all listen through this one protocol.

The calls come from autograd's threads, in the middle of backward: an observer must be quick and must
not synchronise (`parameter_ready` runs once per parameter, on the critical path).
"""
from __future__ import annotations

from typing import Protocol

import torch


class ReducerObserver(Protocol):
    """What a timing observer is told, from autograd's threads, during backward."""

    def parameter_ready(self, index: int) -> None:
        """Parameter `index`'s gradient is in its bucket (the performance model's profile uses this)."""

    def bucket_launched(self, index: int, future: torch.futures.Future) -> None:
        """Bucket `index` was handed to its hook (or all-reduced); `future` completes when it is reduced."""

    def backward_computed(self) -> None:
        """Autograd has produced every gradient; what follows is waiting for communication."""

    def gradients_synchronised(self) -> None:
        """Averaged gradients are in .grad."""
