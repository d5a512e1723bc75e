"""What ddp_core's bucket_cap_mb="auto" would shortlist and prefer for a profiled model on a modelled network.

ddp_core ranks candidates from ready times it measures and an all-reduce cost it fits from a probe, then
measures its shortlist (ddp_core/auto_bucket.py); here the profile's ready times and the network model's
all-reduce cost stand in for its figures, and ddp_core's own functions rank and shortlist, with its margin:
so `advise` says which layouts `auto` would try, and which the model prefers, before anyone trains with it
(in training, the clock decides among them, on its own, fresher figures).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from experiments.core.profile import Profile
from experiments.perfmodel.comm import CommModel

if TYPE_CHECKING:
    from ddp_core.auto_bucket import Decision

_FIT_BYTES = (2**16, 2**20, 2**23, 2**26)  # sizes the network model is read at, to fit latency + per byte


def _decisions(profile: Profile, comm: CommModel, ranks: int) -> tuple["Decision", "Decision"]:
    """ddp_core's model decision for `profile` at `ranks` ranks on `comm`, and the other schedule model's
    over the same candidates, against the measured layout it starts from (PyTorch's defaults, 25 MB and a
    first bucket of 1 MB)."""
    # (imported here: ddp_core imports torch, which building the CLI's parser must not)
    from ddp_core import auto_bucket
    from ddp_core.bucketing import TensorSpec

    specs = [TensorSpec(nbytes, dtype) for nbytes, dtype in zip(profile.nbytes, profile.dtypes)]
    order = sorted(range(len(specs)), key=profile.ready.__getitem__)  # arrival order: the rebuilt buckets'
    first = min(profile.ready)
    ready = [t - first for t in profile.ready]
    backward = max(ready)
    cost = auto_bucket.AllReduceCost.fit([float(b) for b in _FIT_BYTES], [comm.allreduce(b, ranks) for b in _FIT_BYTES])
    # Gloo on the compute cores overlaps nothing: every call adds its time (ddp_core's "serial" model)
    model = "serial" if comm.on_compute_cores(ranks) else "overlapped"
    other = "overlapped" if model == "serial" else "serial"
    measured = (auto_bucket.DEFAULT_CAP_MB, auto_bucket.DEFAULT_FIRST_CAP_MB)
    pairs = auto_bucket.candidate_caps(specs, order, auto_bucket.DEFAULT_FIRST_CAP_MB, measured)
    rest = profile.forward + profile.optimizer + profile.tail
    exposed, _ = auto_bucket.predict(specs, order, ready, backward, cost, *measured, model)
    margin = auto_bucket.MIN_GAIN * (rest + backward + exposed)  # of the measured layout's predicted iteration
    return tuple(auto_bucket.choose_cap(specs, order, ready, backward, cost, rest, m, candidates=pairs, margin=margin)
                 for m in (model, other))


def auto_bucket_shortlist(profile: Profile, comm: CommModel, ranks: int) -> tuple["Decision", list[tuple[float, float]]]:
    """The model's decision and the (cap, first cap) layouts `auto` would measure, the default's first."""
    from ddp_core import auto_bucket

    decision, other = _decisions(profile, comm, ranks)
    picks = auto_bucket.shortlist(decision, other)
    return decision, [(decision.candidates[k].cap_mb, decision.candidates[k].first_cap_mb) for k in picks]
