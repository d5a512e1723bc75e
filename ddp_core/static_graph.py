"""`static_graph=True`: the graph is learned in the first synchronised backward, then relied on.

The first synchronised backward only counts how often each parameter's hook fires and reduces
everything at its end; later ones mark a parameter ready at its last expected call (a layer
checkpointed twice, a weight shared across reentrant backward passes), and the parameters that were
unused then are ready from the start, with no search of the graph and no used-parameter all-reduce.

A part of `Reducer` (see reducer.py): it owns `_learning_graph`, `_calls`, `_calls_left`,
`_never_used` and `_static_used`; the coordinator asks it at each forward and at each end of backward.
"""
from __future__ import annotations

from typing import Callable

import torch


class StaticGraph:
    """Learn the graph once (hook calls per parameter, parameters used), then mark readiness from it."""

    def _init_static_graph(self) -> None:
        """Before the first synchronised backward, which learns the graph if it is declared static."""
        # Static graph: the first synchronised backward counts hook calls per parameter; later ones
        # count down a copy of those counts.
        self._learning_graph = self.static_graph
        self._calls = [0] * len(self.params)
        self._calls_left: list[int] = []
        self._never_used: list[int] = []  # by this rank, in the first backward
        self._static_used: list[int] | None = None  # by some rank, in the first backward

    def set_static_graph(self) -> None:
        """Declare the graph static after construction (PyTorch's `_set_static_graph`): only before the
        first synchronised iteration, which then learns the graph."""
        if self.times.iterations or self._started or self._arrival_order:
            raise RuntimeError("ddp_core: DDP static graph (_set_static_graph) should be called before training "
                               "loop starts; pass static_graph=True to the constructor instead")
        self.static_graph = self._learning_graph = True
        self._rebuild_pending = self._rebuild_enabled
        for handle in self._hook_handles:
            handle.remove()
        self._register_ready_hooks()

    def _static_graph_hook_for(self, index: int, mark: Callable[[int], None]) -> Callable[[torch.Tensor], None]:
        """The ready hook of parameter `index` under a static graph (`mark` buckets its gradient)."""

        def static_graph_hook(param: torch.Tensor) -> None:
            self._locally_used[index] = True
            if not self._armed:
                return
            if not self._started:
                self._start_backward()
            if self._learning_graph:  # first backward: count calls; everything is reduced at its end
                if self._calls[index] == 0 and self._rebuild_pending:
                    self._arrival_order.append(index)
                self._calls[index] += 1
                return
            self._calls_left[index] -= 1
            if self._calls_left[index] <= 0:  # its last expected call (one too many: `mark` refuses)
                mark(index)

        return static_graph_hook

    def _arm_static_graph(self) -> list[int]:
        """A forward under a static graph: the parameters to mark ready at once (none while learning)."""
        # The first backward learns the graph and marks everything at its end; afterwards, the
        # parameters it did not use are the unreached ones, and no graph search is needed.
        unreached = [] if self._learning_graph else self._never_used
        self._calls_left = list(self._calls)
        return unreached

    def _finish_learning_graph(self) -> bool:
        """At the end of the learning backward: remember the graph and mark every parameter ready.
        Returns whether this backward was the learning one."""
        learned_now = self._learning_graph
        if learned_now:
            # Static graph, first iteration: every gradient is final only now. Remember the graph,
            # then bucket (and, with overlap, launch) everything; bucket rebuilding sees the unused
            # parameters first, since later backward passes mark them ready first.
            self._learning_graph = False
            self._never_used = [i for i, calls in enumerate(self._calls) if calls == 0]
            if self._rebuild_pending:
                self._arrival_order[:0] = self._never_used
            for index in range(len(self.params)):
                (self._mark_sparse_ready if self.sparse[index] else self._mark_ready)(index)
        return learned_now

    def _learn_graph_from_others(self, used: list[int]) -> None:
        """A joined rank that never ran a backward: the graph is what the others used (`used`)."""
        self._learning_graph = False
        self._never_used = list(range(len(self.params)))
        self._static_used = used
