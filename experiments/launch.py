"""Run a function on N local ranks, each in its own process with torch.distributed initialised.

Failure handling is the point of this module: a rank that raises ends the whole run at once with that
rank's traceback, a rank that hangs ends it when `timeout` expires, and no process is left behind.
"""
from __future__ import annotations

import datetime
import io
import multiprocessing as mp
import os
import queue
import time
import traceback
from typing import Any, Callable

import torch
import torch.distributed as dist

LOOPBACK = "127.0.0.1"


class RankFailed(RuntimeError):
    """A rank raised; the message holds its traceback."""


class RanksTimedOut(TimeoutError):
    """Some ranks did not finish within the timeout (a hang, or far too much work)."""


def run_ranks(
    fn: Callable[..., Any],
    world_size: int,
    args: tuple = (),
    backend: str = "gloo",
    timeout: float = 120.0,
    threads: int = 1,
    host: str = LOOPBACK,
) -> list[Any]:
    """Call `fn(rank, world_size, *args)` on `world_size` fresh processes; return their results by rank.

    `fn` must be importable (defined at module level) and its result picklable by torch.save.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size!r}")
    if timeout <= 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
    # The parent owns the rendezvous store, so no port can be taken between choosing and binding it.
    store = dist.TCPStore(host, 0, world_size=None, is_master=True, wait_for_workers=False)
    ctx = mp.get_context("spawn")
    results_queue = ctx.Queue()
    procs = [
        ctx.Process(
            target=_rank_main,
            args=(fn, rank, world_size, args, backend, host, store.port, timeout, threads, results_queue),
            daemon=True,
        )
        for rank in range(world_size)
    ]
    for p in procs:
        p.start()
    finished = False
    try:
        results = _collect(procs, results_queue, world_size, timeout)
        finished = True
        return results
    finally:
        _stop(procs, graceful=finished)


def _rank_main(fn, rank, world_size, args, backend, host, port, timeout, threads, results_queue) -> None:
    try:
        torch.set_num_threads(threads)
        store = dist.TCPStore(host, port, world_size=None, is_master=False, timeout=datetime.timedelta(seconds=timeout))
        dist.init_process_group(
            backend, store=store, rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=timeout)
        )
        result = fn(rank, world_size, *args)
        buffer = io.BytesIO()
        torch.save(result, buffer)
        results_queue.put(("ok", rank, buffer.getvalue()))
    except BaseException:  # noqa: BLE001 - every failure must reach the parent
        results_queue.put(("error", rank, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _collect(procs, results_queue, world_size: int, timeout: float) -> list[Any]:
    results: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    while len(results) < world_size:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            missing = sorted(set(range(world_size)) - set(results))
            raise RanksTimedOut(f"rank(s) {missing} did not finish within {timeout:.0f} s (hung or too slow)")
        try:
            status, rank, payload = results_queue.get(timeout=min(remaining, 1.0))
        except queue.Empty:
            dead = [r for r, p in enumerate(procs) if r not in results and p.exitcode not in (None, 0)]
            if dead:
                raise RankFailed(f"rank {dead[0]} died with exit code {procs[dead[0]].exitcode} before reporting")
            continue
        if status == "error":
            raise RankFailed(f"rank {rank} of {world_size} raised:\n{payload}")
        results[rank] = torch.load(io.BytesIO(payload), weights_only=False)
    return [results[r] for r in range(world_size)]


def _stop(procs, graceful: bool) -> None:
    # After a failure the other ranks may sit in a collective forever: do not wait for them.
    if graceful:
        for p in procs:
            p.join(timeout=10)
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            os.kill(p.pid, 9)
            p.join()
