"""What ddp_core's bucket_cap_mb="auto" would choose for a profiled model on a modelled network.

ddp_core decides from ready times it measures and an all-reduce cost it fits from a probe
(ddp_core/auto_bucket.py); here the profile's ready times and the network model's all-reduce cost stand
in for them, and ddp_core's own decision function chooses, with its margin: so `advise` says what `auto`
would do before anyone trains with it (the choice in training rests on its own, fresher figures).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from experiments.core.profile import Profile
from experiments.perfmodel.comm import CommModel

if TYPE_CHECKING:
    from ddp_core.auto_bucket import Decision

_FIT_BYTES = (2**16, 2**20, 2**23, 2**26)  # sizes the network model is read at, to fit latency + per byte


def auto_bucket_choice(profile: Profile, comm: CommModel, ranks: int) -> "Decision":
    """ddp_core's decision for `profile` at `ranks` ranks on `comm`, against the measured layout it starts
    from (PyTorch's defaults, 25 MB and a first bucket of 1 MB)."""
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
    measured = (auto_bucket.DEFAULT_CAP_MB, auto_bucket.DEFAULT_FIRST_CAP_MB)
    pairs = auto_bucket.candidate_caps(specs, order, auto_bucket.DEFAULT_FIRST_CAP_MB, measured)
    rest = profile.forward + profile.optimizer + profile.tail
    exposed, _ = auto_bucket.predict(specs, order, ready, backward, cost, *measured, model)
    margin = auto_bucket.MIN_GAIN * (rest + backward + exposed)  # of the measured layout's predicted iteration
    return auto_bucket.choose_cap(specs, order, ready, backward, cost, rest, model, candidates=pairs, margin=margin)
