"""The emulated cluster: links deliver their rate, nothing is left behind, and a machine that cannot
emulate is refused up front. Runs as root (as CI does); low rates and small messages keep it fast."""
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.cli import main
from experiments.core.config import RunConfig
from experiments.core.records import read_records
from experiments.emulate import network
from experiments.measure.sweep import run_jobs
from tests.processes import alive, flaky_measure, namespaces_of, wait_for
from tests.start_up import rank_start_up_s, timeout_after_start_up
from tests.unit.test_runner import TINY
from tests.unit.test_network import PROBLEMS

ROOT = Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.skipif(bool(PROBLEMS), reason=f"this machine cannot emulate a cluster: {PROBLEMS}")


def _interfaces() -> str:
    """The machine's own interfaces: the emulation must never add, remove or change one."""
    return subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout


@pytest.mark.timeout(300)
def test_allreduce_over_a_link_takes_the_time_its_rate_sets(tmp_path):
    out, before = tmp_path / "a.jsonl", _interfaces()
    # 2 MB per rank at 100 Mbit/s: 0.16 s on the wire per all-reduce, far above Gloo's CPU cost.
    assert main(["allreduce", "--mode", "size", "--sizes", "2000000", "--link", "100mbit", "--ranks-per-host", "1,2",
                 "--reps", "3", "--warmup", "1", "--out", str(out)]) == 0
    between_hosts, same_host = read_records(out)
    assert between_hosts["config"]["link"] == "100mbit" and between_hosts["config"]["ranks_per_host"] == 1
    assert between_hosts["correct"] and same_host["correct"]
    assert between_hosts["env"]["network"]["qdisc"].startswith("tbf rate 100mbit")
    rate_gbytes = 100e6 / 8 / 1e9
    assert between_hosts["summary"]["busbw_GBps"] == pytest.approx(rate_gbytes, rel=0.2)
    # Ranks of one host talk over its loopback, which is not shaped.
    assert same_host["summary"]["busbw_GBps"] > 3 * rate_gbytes
    assert not namespaces_of(os.getpid()) and _interfaces() == before


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_training_sweep_on_two_emulated_hosts_records_its_network(tmp_path, capfd):
    out = tmp_path / "r.jsonl"
    assert main(["run", *TINY, "--link", "200mbit", "--impl", "ddp_core,torch", "--out", str(out)]) == 0
    # (the parent's store and every rank connect to the switch's address, which has no name: c10d's warning
    # about it is not printed, by the parent or by a rank)
    assert "hostname of the client socket" not in capfd.readouterr().err
    records = read_records(out)
    assert len(records) == 2 and all(r["status"] == "ok" and r["correct"] for r in records)
    assert {r["config"]["link"] for r in records} == {"200mbit"}
    assert records[0]["env"]["network"]["hosts"] == 2
    assert not namespaces_of(os.getpid())


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_crashing_or_hanging_rank_leaves_no_namespace_behind(tmp_path):
    jobs = [RunConfig(seed=s, link="100mbit") for s in range(3)]  # ok, crash on rank 1, hang on rank 0
    # The first job's timeout covers its ranks' start-up on emulated hosts: scaled from this machine's now
    # (15 s was too short at a load average of 11).
    timeout = timeout_after_start_up(rank_start_up_s(link="100mbit"))
    counts = run_jobs(jobs, tmp_path / "r.jsonl", flaky_measure,
                      lambda job, per_rank, wall: {"kind": "run", "status": "ok", "config": {"seed": job.seed},
                                                   "summary": {"p50": wall}},
                      "run", timeout=timeout, echo=lambda line: None)
    assert counts == {"ok": 1, "failed": 2, "skipped": 0}
    assert not namespaces_of(os.getpid())


def _start_sweep(out, *extra):
    # About 0.2 s per iteration at 1 Gbit/s: the first config is recorded within seconds, the rest take longer.
    argv = [sys.executable, "-m", "experiments", "run", *TINY, "--iters", "30", "--link", "1gbit",
            "--bucket-mb", "25,1,0", *extra, "--out", str(out)]
    return subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _kill(proc) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ctrl_c_removes_the_emulated_network(tmp_path):
    out = tmp_path / "r.jsonl"
    proc = _start_sweep(out)
    try:
        wait_for(lambda: out.exists() and out.read_text().strip())
        assert namespaces_of(proc.pid)  # the sweep is still on its emulated hosts
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        _kill(proc)
    assert proc.returncode == 130, err
    assert not namespaces_of(proc.pid)


@pytest.mark.timeout(300)
def test_cleanup_removes_what_a_killed_run_left_and_keeps_a_live_runs(tmp_path, capsys):
    killed = _start_sweep(tmp_path / "killed.jsonl")
    try:
        wait_for(lambda: len(namespaces_of(killed.pid)) == 3)  # switch and two hosts
    finally:
        _kill(killed)  # SIGKILL: no finally block of the run's runs
    left = namespaces_of(killed.pid)
    assert len(left) == 3  # what a killed run leaves
    with network.EmulatedCluster(1, "100mbit") as live:  # a run of this process, still going
        assert main(["network", "--cleanup"]) == 0
        printed = capsys.readouterr().out
        assert all(f"removed {name}" in printed for name in left)
        assert f"kept {live.switch}" in printed and live.switch in network.list_netns()
    assert not namespaces_of(killed.pid) and not namespaces_of(os.getpid())
    wait_for(lambda: not any(alive(int(p)) for p in _children_of(killed.pid)), 30)


def _children_of(pid: int) -> list[str]:
    found = subprocess.run(["pgrep", "-s", str(pid)], capture_output=True, text=True).stdout.split()
    return [p for p in found if p != str(pid)]
