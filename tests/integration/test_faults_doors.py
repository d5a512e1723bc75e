"""Doors a run must keep shut and rooms it must leave empty: the rendezvous store and the ranks listen on
loopback (or inside the emulated network) alone; Ctrl-C, however often, leaves no network namespace; an
interrupted A/B stops its child `ddpbench run` with SIGTERM and waits for it; a killed A/B's worktrees
are pruned by the next one, and nobody else's are."""
import ipaddress
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from experiments.emulate import network
from experiments.measure.launch import RankPool
from tests.processes import namespaces_of, wait_for
from tests.unit.test_faults_doors import ROOT


NETWORK_PROBLEMS = network.check()


needs_network = pytest.mark.skipif(bool(NETWORK_PROBLEMS),
                                   reason=f"this machine cannot emulate a cluster: {NETWORK_PROBLEMS}")


def hold_after_allreduce(rank, world_size, marks: str):
    """On every rank: one all-reduce (so every socket a collective needs is open), then say so and wait
    until the test has looked (marks/release), at most a minute."""
    import torch
    import torch.distributed as dist

    dist.all_reduce(torch.ones(4))
    (Path(marks) / f"ready{rank}").touch()
    deadline = time.monotonic() + 60
    while not (Path(marks) / "release").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return rank


def _descendants(pid: int) -> set[int]:
    """`pid` and every process below it."""
    found, todo = set(), [pid]
    while todo:
        current = todo.pop()
        found.add(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            try:
                todo += [int(child) for child in (task / "children").read_text().split()]
            except OSError:
                pass  # gone meanwhile
    return found


def _listening(pids: set[int], netns: str | None = None) -> list[str]:
    """The local addresses (host part) that processes `pids` listen on for TCP, per `ss -ltnp`."""
    command = ["ss", "-ltnpH"] if netns is None else ["ip", "netns", "exec", netns, "ss", "-ltnpH"]
    addresses = []
    for line in subprocess.run(command, capture_output=True, text=True, check=True).stdout.splitlines():
        if any(f"pid={pid}," in line for pid in pids):
            host = line.split()[3].rsplit(":", 1)[0].strip("[]").split("%")[0]
            addresses.append(host)
    return addresses


def _loopback(host: str) -> bool:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False  # "*": every interface
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def _hold_pool(pool: RankPool, marks: Path):
    """Start the holding task on `pool` in a thread; return the thread once every rank is holding."""
    worker = threading.Thread(target=pool.run, args=(hold_after_allreduce, (str(marks),), 120))
    worker.start()
    wait_for(lambda: all((marks / f"ready{r}").exists() for r in range(pool.world_size)) or not worker.is_alive())
    assert worker.is_alive(), "the ranks failed before holding"
    return worker


@pytest.mark.skipif(shutil.which("ss") is None, reason="`ss` (iproute2) is missing")
@pytest.mark.timeout(180)
def test_the_store_and_the_ranks_listen_on_loopback_alone(tmp_path):
    with RankPool(2, timeout=120) as pool:
        worker = _hold_pool(pool, tmp_path)
        try:
            addresses = _listening(_descendants(os.getpid()))
        finally:
            (tmp_path / "release").touch()
            worker.join()
    assert addresses, "no listening socket found: the rendezvous store should be one"
    outside = [a for a in addresses if not _loopback(a)]
    assert not outside, f"the run listens beyond loopback: {addresses}"


@needs_network
@pytest.mark.timeout(180)
def test_with_emulated_hosts_the_store_listens_on_the_switch_alone(tmp_path):
    with RankPool(2, timeout=120, link="100mbit") as pool:
        worker = _hold_pool(pool, tmp_path)
        try:
            ours = _descendants(os.getpid())
            on_the_machine = _listening(ours)
            on_the_switch = _listening(ours, pool.cluster.switch)
        finally:
            (tmp_path / "release").touch()
            worker.join()
    assert all(_loopback(a) for a in on_the_machine), on_the_machine
    assert on_the_switch == [network.SWITCH_ADDRESS]


@needs_network
@pytest.mark.timeout(300)
@pytest.mark.parametrize("when", ["starting", "measuring"])
def test_three_ctrl_c_in_a_row_leave_no_namespace(tmp_path, when):
    out = tmp_path / "r.jsonl"
    argv = [sys.executable, "-m", "experiments", "run", "--model", "resnet-tiny", "--image-size", "16",
            "--batch-size", "2", "--iters", "200", "--warmup", "1", "--link", "1gbit", "--out", str(out)]
    # A session of its own: Ctrl-C goes to the whole process group, as a terminal sends it.
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        wait_for(lambda: len(namespaces_of(proc.pid)) == 3 or proc.poll() is not None)
        if when == "measuring":  # the ranks have reached the store, then run iterations for a while
            wait_for(lambda: _store_connected(proc.pid) or proc.poll() is not None)
            time.sleep(1.0)
        for _ in range(3):
            os.killpg(proc.pid, signal.SIGINT)
            time.sleep(0.01)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        left = namespaces_of(proc.pid)
        for netns in left:  # this test's own leftovers, so that a failure does not stay on the machine
            subprocess.run(["ip", "netns", "del", netns], capture_output=True)
    assert not left, f"left behind: {left}; stderr: {err[-2000:]}"
    assert proc.returncode == 130, err[-2000:]


def _store_connected(pid: int) -> bool:
    """Whether ranks hold connections to the store of run `pid` (in its switch namespace)."""
    switches = [n for n in namespaces_of(pid) if n.endswith("-sw")]
    return bool(switches) and any(f"pid={pid}," in line for line in subprocess.run(
        ["ip", "netns", "exec", switches[0], "ss", "-tnpH"], capture_output=True, text=True).stdout.splitlines())
