"""The bucket schedule on paper: when each bucket's all-reduce starts and ends, given when it is ready.

DDP launches bucket i only after bucket i-1 (every rank must issue collectives in the same order), and
bucket i goes to process group i mod k. Each group is one channel that reduces its buckets in order;
channels overlap their per-call latency but share the link's bandwidth, which serves one bucket at a
time. The same replay serves ddp_core's own bucket-cap tuner (`auto_bucket`) and the suite's
performance model (`experiments/perfmodel/simulate.py`), which is why it lives here: ddp_core imports
nothing from the suite.
"""
from __future__ import annotations

from typing import Callable


def replay(buckets: list[dict], allreduce: Callable[[int], float], latency: float, channels: int = 1) -> float:
    """Launch `buckets` (dicts with "bytes" and "ready", seconds) in order over `channels`; returns when the
    last all-reduce completes and sets each bucket's "start" and "done".

    `allreduce(nbytes)`: seconds of one all-reduce of that size; `latency`: its size-independent part,
    which overlaps across channels (the rest needs the shared link).
    """
    if channels < 1:
        raise ValueError(f"channels must be >= 1, got {channels!r}")
    launched = link_free = 0.0
    channel_free = [0.0] * channels
    for index, bucket in enumerate(buckets):
        launched = max(bucket["ready"], launched)  # bucket i never starts before bucket i-1
        start = max(launched, channel_free[index % channels])
        transfer = allreduce(bucket["bytes"]) - latency
        link_free = max(start + latency, link_free) + transfer
        channel_free[index % channels] = link_free
        bucket.update(start=start, done=link_free)
    return link_free
