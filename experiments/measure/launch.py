"""Local ranks: N processes with torch.distributed initialised, running functions sent to them.

Failure handling is the point of this module: a rank that raises ends the task at once with that
rank's traceback, a rank that hangs ends it when the timeout expires, and no process is left behind
(the workers die with the parent, even if the parent is killed). A pool runs many tasks in the same
processes, so a sweep pays process and process-group start-up once per world size, not per config;
ranks are forked from a server that imported torch once per run (see FORKSERVER_PRELOAD).
"""
from __future__ import annotations

import atexit
import contextlib
import datetime
import io
import itertools
import multiprocessing as mp
import os
import queue
import select
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from multiprocessing import reduction
from typing import Any, Callable

import torch
import torch.distributed as dist

from experiments.core.procfs import process_lives, process_stat
from experiments.emulate import network
from experiments.measure import progress

LOOPBACK = "127.0.0.1"


class RankFailed(RuntimeError):
    """A rank raised or died; the message holds its traceback."""


class RanksTimedOut(TimeoutError):
    """Some ranks did not finish within the timeout (a hang, or far too much work)."""


class RankPool:
    """`world_size` worker processes that run `fn(rank, world_size, *args)` on request.

    After a failure or timeout the pool is closed (its ranks may be stuck in a collective); start a
    new one to go on.
    """

    def __init__(self, world_size: int, backend: str = "gloo", threads: int = 1, timeout: float = 120.0,
                 host: str = LOOPBACK, link: str = "none", ranks_per_host: int = 1):
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size!r}")
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        self.world_size = world_size
        self.closed = True  # until the ranks are created
        # With a link, ranks run on emulated hosts (network namespaces) and the store listens on the switch.
        self.cluster = None
        placements: list[network.Placement | None] = [None] * world_size
        if link != "none":
            # Held before it is made: an interruption while making it still finds it to remove.
            self.cluster = network.EmulatedCluster(network.hosts_needed(world_size, ranks_per_host), link)
            host = network.SWITCH_ADDRESS
            placements = [self.cluster.placement(rank, ranks_per_host) for rank in range(world_size)]
        try:
            if self.cluster is not None:
                self.cluster.create()
            # The parent owns the rendezvous store, so no port can be taken between choosing and binding it.
            self._store = self._in_network(lambda: listening_store(host))
        except BaseException:
            self._close_network()
            raise
        ctx = rank_context()
        self._results = ctx.Queue()
        self._tasks = [ctx.Queue() for _ in range(world_size)]
        self._task_ids = itertools.count()
        self._procs = [
            ctx.Process(
                target=_worker_main,
                args=(rank, world_size, backend, host, self._store.port, timeout, threads, self._tasks[rank],
                      self._results, os.getpid(), placements[rank], dict(os.environ),
                      (_ParentFd(1), _ParentFd(2))),
                daemon=True,
            )
            for rank in range(world_size)
        ]
        self.closed = False
        try:
            for p in self._procs:
                p.start()
            _note_server(self._procs)
        except BaseException:
            self.close(graceful=False)  # e.g. Ctrl-C while starting: no rank, no namespace left behind
            raise

    def _in_network(self, fn: Callable[[], Any]) -> Any:
        return fn() if self.cluster is None else self.cluster.run_in_switch(fn)

    def _close_network(self) -> None:
        self._store = None  # closes the store's socket, which would keep the switch namespace alive
        if self.cluster is not None:
            self.cluster.close()

    def run(self, fn: Callable[..., Any], args: tuple = (), timeout: float = 120.0,
            on_progress: Callable[[str, int, int], None] | None = None) -> list[Any]:
        """Run `fn` on every rank; return the results by rank, or raise RankFailed / RanksTimedOut.
        `on_progress(phase, done, total)` hears what rank 0's task reports (experiments.measure.progress)."""
        if self.closed:
            raise RuntimeError("this RankPool is closed; start a new one")
        task_id = next(self._task_ids)
        for q in self._tasks:
            q.put((task_id, fn, args, on_progress is not None))
        try:
            return self._collect(task_id, timeout, on_progress)
        except BaseException:
            self.close(graceful=False)  # includes Ctrl-C: never leave ranks behind
            raise

    def _collect(self, task_id: int, timeout: float, on_progress=None) -> list[Any]:
        results: dict[int, Any] = {}
        deadline = time.monotonic() + timeout
        while len(results) < self.world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = sorted(set(range(self.world_size)) - set(results))
                raise RanksTimedOut(f"rank(s) {missing} did not finish within {timeout:.0f} s (hung or too slow)")
            try:
                tid, status, rank, payload = self._results.get(timeout=min(remaining, 1.0))
            except queue.Empty:
                dead = [r for r, p in enumerate(self._procs) if r not in results and p.exitcode is not None]
                if dead:
                    code = self._procs[dead[0]].exitcode
                    raise RankFailed(f"rank {dead[0]} of {self.world_size} died with exit code {code} before reporting")
                continue
            if tid not in (task_id, -1):  # -1: the rank failed while starting up
                continue  # a late answer to an earlier task
            if status == "progress":
                if on_progress is not None:
                    on_progress(*payload)
                continue
            if status == "error":
                raise RankFailed(f"rank {rank} of {self.world_size} raised:\n{payload}")
            results[rank] = torch.load(io.BytesIO(payload), weights_only=False)
        return [results[r] for r in range(self.world_size)]

    def close(self, graceful: bool = True) -> None:
        """Stop the workers: politely after success, at once after a failure (they may be stuck); then
        remove the emulated network, if any."""
        if self.closed:
            return
        self.closed = True
        try:
            if graceful:  # a Ctrl-C while waiting here goes on to the forced stop below
                for q in self._tasks:
                    q.put(None)
                for p in self._procs:
                    p.join(timeout=10)
        finally:
            # Quick and not to be cut short by more Ctrl-C: no rank and no namespace may be left behind.
            with network.signals_held():
                for p in self._procs:
                    if p.is_alive():
                        p.kill()
                for p in self._procs:
                    if p.pid is not None:  # started
                        p.join()
                self._close_network()

    def __enter__(self) -> "RankPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close(graceful=exc[0] is None)


def run_ranks(fn: Callable[..., Any], world_size: int, args: tuple = (), backend: str = "gloo",
              timeout: float = 120.0, threads: int = 1, host: str = LOOPBACK, link: str = "none",
              ranks_per_host: int = 1) -> list[Any]:
    """Call `fn(rank, world_size, *args)` once on `world_size` fresh processes; return results by rank.

    `fn` must be importable (defined at module level) and its result picklable by torch.save.
    """
    with RankPool(world_size, backend=backend, threads=threads, timeout=timeout, host=host, link=link,
                  ranks_per_host=ranks_per_host) as pool:
        return pool.run(fn, args, timeout=timeout)


# c10d's warning on connecting to a TCPStore whose address has no name (socket.cpp formats the peer's address
# with getnameinfo): an emulated host's address (198.18.0.0/15) is in no /etc/hosts, and its namespace reaches
# no DNS server, so the lookup fails (EAI_AGAIN, err=-3). The connection itself is fine; the address is
# shown as numbers. No setting of c10d silences this one message (TORCH_CPP_LOG_LEVEL would hide all its
# warnings), and the machine's /etc/hosts is not ours to change.
NAMELESS_PEER = b"The hostname of the client socket cannot be retrieved"


@contextlib.contextmanager
def stderr_without(needle: bytes):
    """Run the block with this process's standard error (file descriptor 2, where C++ logs go) caught, then
    write what was printed back to it, less the lines that hold `needle`."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with tempfile.TemporaryFile() as caught:
            os.dup2(caught.fileno(), 2)
            try:
                yield
            finally:
                sys.stderr.flush()
                os.dup2(saved, 2)
                caught.seek(0)
                kept = [line for line in caught.read().splitlines(keepends=True) if needle not in line]
                if kept:
                    os.write(2, b"".join(kept))
    finally:
        os.close(saved)


def listening_store(host: str) -> dist.TCPStore:
    """A master TCPStore that listens on `host` alone, on a free port (its `.port`).

    Left to itself, TCPStore listens on every interface whatever host it is given, and anyone who can
    reach the machine could read and write the ranks' keys: the socket is bound here and handed over.
    """
    family, kind, proto, _, address = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0]
    listener = socket.socket(family, kind, proto)
    try:
        listener.bind(address[:2] if family == socket.AF_INET else address)
        listener.listen(socket.SOMAXCONN)
        with stderr_without(NAMELESS_PEER):  # (the master store connects a client to itself)
            store = dist.TCPStore(host, listener.getsockname()[1], world_size=None, is_master=True,
                                  wait_for_workers=False, master_listen_fd=listener.fileno())
    except BaseException:
        listener.close()
        raise
    listener.detach()  # the store owns the socket now and closes it when it goes
    return store


# Ranks are forked from multiprocessing's fork server, which has imported these once per run. Under
# "spawn" every rank of every pool imported torch itself: about 2 s a rank, the ranks of a pool contending
# for the cores, at each pool start (a sweep over world sizes, the main job's steps, the test suite).
# Forking from the server is safe: it has only imported modules (no CUDA initialised, no OpenMP region
# run; PyTorch's DataLoader forks its workers from processes far busier), and each rank is still a new
# process that has run nothing. What "spawn" gave for
# free is handed over explicitly: the parent's environment and standard output and error as they are at
# the pool's start (the server's are those of the run's first pool); sys.path and the working directory
# travel with every rank anyway (multiprocessing's preparation data).
FORKSERVER_PRELOAD = ["torch", "torch.distributed", __name__]


def rank_context() -> mp.context.BaseContext:
    """The multiprocessing context that starts ranks: the fork server, preloaded (see FORKSERVER_PRELOAD)."""
    context = mp.get_context("forkserver")
    context.set_forkserver_preload(FORKSERVER_PRELOAD)  # takes effect when the server starts (first pool)
    return context


_servers: set[int] = set()  # the fork servers this process's ranks came from (one, unless it was restarted)


def _note_server(procs: list) -> None:
    """Remember the fork server that started `procs`, to stop and wait for it when this process exits."""
    parents = {int(fields[1]) for proc in procs if (fields := process_stat(proc.pid)) is not None}
    _servers.update(parents - {os.getpid()})


def _stop_servers() -> None:
    """Stop the fork servers and wait for them. Left alone, a server outlives this process for a moment
    and is then nobody's child: its CPU time and its ranks' would never reach whoever waits for this
    process (an A/B round counts what other processes kept busy as the machine's time less its descendants')."""
    for pid in _servers:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
            os.waitpid(pid, 0)
    _servers.clear()


atexit.register(_stop_servers)


class _ParentFd:
    """One of the parent's file descriptors, sent to a rank as it starts (a rank forked from the fork
    server would otherwise write to the server's standard output, not the parent's current one)."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self):
        return _take_fd, (reduction.DupFd(self.fd),)  # DupFd: only while multiprocessing starts a process


def _take_fd(duplicate) -> int:
    return duplicate.detach()


def _adopt_parent_state(environ: dict[str, str], stdio: tuple[int, int]) -> None:
    """Take on the environment and the standard output and error that the parent had at the pool's start."""
    os.environ.clear()
    os.environ.update(environ)
    for fd, target in zip(stdio, (1, 2)):
        os.dup2(fd, target)
        os.close(fd)


def _end_with_run(run_pid: int) -> None:
    """Kill this rank (SIGKILL) as soon as process `run_pid`, the run that started its pool, has ended,
    however it ended, so that no rank is orphaned. A thread waits for it: the rank's parent is the fork
    server, which multiprocessing keeps alive while any process it forked lives (each holds the pipe whose
    end tells the server to stop), so a signal at the parent's death (PR_SET_PDEATHSIG) would never come."""
    def wait_and_die() -> None:
        try:
            with contextlib.closing(os.pidfd_open(run_pid)) as run:  # readable once the run has ended
                select.select([run], [], [])
        except ProcessLookupError:
            pass  # ended already
        except (AttributeError, OSError):  # no pidfd (not Linux >= 5.3): look every second
            while process_lives(run_pid):
                time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=wait_and_die, name="ddpbench-end-with-run", daemon=True).start()


def _worker_main(rank, world_size, backend, host, port, timeout, threads, tasks, results, parent_pid,
                 placement, environ, stdio) -> None:
    _end_with_run(parent_pid)
    _adopt_parent_state(environ, stdio)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    task_id = -1
    try:
        if placement is not None:
            network.enter_host(placement)  # before the first socket: every socket opens in the host's namespace
        else:
            # Local ranks talk over loopback; Gloo would otherwise listen on the address the machine's
            # name resolves to, which may be an external one.
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        torch.set_num_threads(threads)
        with stderr_without(NAMELESS_PEER):
            store = dist.TCPStore(host, port, world_size=None, is_master=False,
                                  timeout=datetime.timedelta(seconds=timeout))
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout))
        while (task := tasks.get()) is not None:
            task_id, fn, args, wants_progress = task
            # Rank 0 speaks for all (they run in step); progress goes to the parent only where it is shown.
            progress.listen((lambda *info, task_id=task_id: results.put((task_id, "progress", rank, info)))
                            if wants_progress and rank == 0 else None)
            result = fn(rank, world_size, *args)
            buffer = io.BytesIO()
            torch.save(result, buffer)
            results.put((task_id, "ok", rank, buffer.getvalue()))
    except BaseException:  # noqa: BLE001 - every failure must reach the parent
        results.put((task_id, "error", rank, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
