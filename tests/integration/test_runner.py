"""The experiment runner: grid, validation, records, resume, faults, and tiny end-to-end sweeps."""
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from experiments.cli import main
from experiments.core.config import RunConfig
from experiments.core.records import append_record, load_records, read_records
from experiments.measure.sweep import run_jobs
from tests.processes import alive, flaky_measure
from tests.start_up import rank_start_up_s, timeout_after_start_up
from tests.unit.test_runner import TINY


ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_tiny_sweep_end_to_end_records_and_resumes(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DDPBENCH_RESULTS", str(tmp_path))  # --dry-run reads no records but this test's
    out, trace = tmp_path / "r.jsonl", tmp_path / "trace"
    argv = ["run", *TINY, "--world-size", "2", "--impl", "ddp_core,torch", "--sync-every", "1,3",
            "--out", str(out)]
    capsys.readouterr()
    assert main([*argv, "--trace", str(trace)]) == 0
    printed = capsys.readouterr()
    # stderr is no terminal here: no bar, no carriage return; stdout holds the summary lines alone
    assert "\r" not in printed.err + printed.out and "warm-up" not in printed.err and "it/s" not in printed.err
    assert [line[:5] for line in printed.out.splitlines()] == ["[1/4]", "[2/4]", "[3/4]", "[4/4]", "ddpbe"]
    records = read_records(out)
    assert len(records) == 4 and all(r["status"] == "ok" and r["correct"] for r in records)
    for r in records:
        assert len(r["latency_s"]) == 3 and r["summary"]["p50"] > 0
        assert r["env"]["git_commit"] and r["env"]["torch"]
    frame = load_records(out)
    assert (frame["forward_s"] > 0).all() and (frame["backward_s"] > 0).all()
    assert frame["exposed_comm_s"].notna().all(), frame[["impl", "sync_every", "exposed_comm_s"]]
    # PyTorch's DDP: exposed communication comes from its logging data, one synchronised iteration late,
    # so the last synchronised iteration has none.
    theirs = next(r for r in records if r["config"]["impl"] == "torch" and r["config"]["sync_every"] == 1)
    for rank_exposed in theirs["phases_s"]["exposed_comm"]:
        assert [e is None for e in rank_exposed] == [False, False, True]
        assert all(e >= 0 for e in rank_exposed[:2])
    ours = next(r for r in records if r["config"]["impl"] == "ddp_core" and r["config"]["sync_every"] == 1)
    assert ours["buckets"][0], "per-bucket launch and completion times are missing"
    trace_events = json.loads(next(trace.glob("resnet-tiny_ddp_core_*_sync1_*.json")).read_text())["traceEvents"]
    names = {e["name"] for e in trace_events}
    assert {"forward", "backward", "exposed_comm", "optimizer"} <= names
    assert any(n.startswith("all-reduce bucket") for n in names)
    capsys.readouterr()
    assert main([*argv, "--resume"]) == 0
    assert "0 ok, 0 failed, 4 skipped" in capsys.readouterr().out
    assert len(read_records(out)) == 4

    # --dry-run: twice the iterations, and a world size never measured here; it starts no process
    monkeypatch.setattr("experiments.measure.sweep.RankPool", None)
    size = out.stat().st_size
    assert main([*argv, "--iters", "6", "--world-size", "2,3", "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 9 and out.stat().st_size == size, lines
    assert all("world_size=2" in line and ": about " in line and "1 record of this machine" in line
               for line in lines[:4]), lines
    assert all("world_size=3" in line and "no estimate" in line for line in lines[4:8]), lines
    assert lines[8].startswith("ddpbench run --dry-run: 8 config(s) to measure, 0 skipped") and "4 without" in lines[8]
    # the first config of each set of ranks runs twice (once unrecorded), and two sets start
    assert "run twice" in lines[0] and not any("run twice" in line for line in lines[1:4]), lines
    assert "plus starting 2 set(s) of ranks" in lines[8], lines[8]
    from experiments.measure.dryrun import estimate

    ours = records[0]
    t = ours["timing"]
    overhead = t["config_wall_s"] - t["setup_s"] - t["warmup_s"] - t["measured_s"]
    assert estimate(ours["config"], records) == (pytest.approx(t["config_wall_s"]), 1)  # the same config
    assert estimate({**ours["config"], "iters": 6}, records)[0] == \
        pytest.approx(t["setup_s"] + t["warmup_s"] + 2 * t["measured_s"] + overhead)
    # measured into one --out, estimated for another: from this machine's timing log (once, not once per copy)
    assert main([*argv, "--out", str(tmp_path / "elsewhere.jsonl"), "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert all(": about " in line and "(from 1 record of this machine" in line for line in lines[:4]), lines
    assert not (tmp_path / "elsewhere.jsonl").exists()
    # another machine's records give no estimate (with this machine's log out of sight); --resume marks what it
    # would skip
    other = tmp_path / "other.jsonl"
    for record in records:
        append_record(other, {**record, "env": {**record["env"], "machine_id": "another"}})
    monkeypatch.setenv("DDPBENCH_RESULTS", str(tmp_path / "no-log"))
    assert main([*argv, "--out", str(other), "--dry-run"]) == 0
    assert sum("no estimate" in line for line in capsys.readouterr().out.splitlines()) == 4
    assert main([*argv, "--resume", "--dry-run"]) == 0
    assert capsys.readouterr().out.count("skipped (already recorded") == 4


@pytest.mark.timeout(300)
def test_on_a_terminal_the_iterations_of_a_config_show_as_a_bar(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("experiments.measure.progress.shown", lambda stream=None: True)  # as on a terminal
    assert main(["run", *TINY, "--world-size", "2", "--out", str(tmp_path / "r.jsonl")]) == 0
    err = capsys.readouterr().err
    assert "warm-up: " in err and "/1 [" in err, err  # TINY: 1 warm-up iteration, 3 measured
    assert "measured: " in err and "/3 [" in err, err


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_run_warns_once_after_configs_that_another_process_kept_cores_busy_during(tmp_path, capsys):
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)  # running before the config's measured iterations start
        assert main(["run", *TINY, "--world-size", "2", "--iters", "30", "--seed", "1,2",
                     "--out", str(tmp_path / "r.jsonl")]) == 0
    finally:
        busy.kill()
        busy.wait()
    records = read_records(tmp_path / "r.jsonl")
    assert all(r["timing"]["other_cores_busy"] > 0.2 for r in records), [r["timing"] for r in records]
    printed = capsys.readouterr()
    lines = printed.out.splitlines()
    assert all(" (busy " in line and line.endswith(" cores)") for line in lines[:2]), lines  # a mark on each line
    assert printed.err.count("ddpbench: warning: other processes kept") == 1, printed.err  # one warning, at the end
    assert "while 2 of 2 configs were measured" in printed.err and "during [" in printed.err, printed.err


CALLS = []  # per rank process: the jobs it measured, in order


def counting_measure(rank, world_size, fields):
    """A stand-in workload that reports which calls its process has run so far."""
    CALLS.append(fields["seed"])
    return {"calls": list(CALLS), "pid": os.getpid()}


@pytest.mark.timeout(120)
def test_fresh_ranks_run_their_first_job_once_unrecorded_before_measuring_it(tmp_path):
    # Freshly started ranks ran their first job slower throughout (a fresh process re-faults its freed memory
    # every iteration, benchmarks/first_model_page_faults.py): every recorded job must meet ranks that have run one.
    # A job of another world size between them: the two of world size 1 still share one pool (run_jobs groups).
    out = tmp_path / "r.jsonl"
    run_jobs([RunConfig(seed=7, world_size=1), RunConfig(seed=9, world_size=2), RunConfig(seed=8, world_size=1)],
             out, counting_measure,
             lambda job, per_rank, wall: {"kind": "run", "status": "ok", "config": {"seed": job.seed},
                                          "summary": {"p50": wall}, "calls": per_rank[0]["calls"],
                                          "pid": per_rank[0]["pid"]}, "run", echo=lambda line: None)
    first, second, other = read_records(out)
    assert first["pid"] == second["pid"] != other["pid"]  # one pool per world size
    assert first["calls"] == [7, 7] and second["calls"] == [7, 7, 8] and other["calls"] == [9, 9]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_crashing_or_hanging_rank_is_recorded_as_failed_and_the_sweep_goes_on(tmp_path):
    out = tmp_path / "r.jsonl"
    jobs = [RunConfig(seed=s) for s in range(4)]
    lines = []
    # The timeout also covers fresh ranks' start-up (jobs 0, 2 and 3 start ranks): scaled from this machine's now.
    timeout = timeout_after_start_up(rank_start_up_s())
    ends = [time.monotonic()]

    def echo(line):
        ends.append(time.monotonic())
        lines.append(line)

    counts = run_jobs(jobs, out, flaky_measure, lambda job, per_rank, wall: {"kind": "run", "status": "ok",
                      "config": {"seed": job.seed}, "summary": {"p50": wall}, "pids": [r["pid"] for r in per_rank]},
                      "run", timeout=timeout, echo=echo)
    took = [b - a for a, b in zip(ends, ends[1:])]
    # The crash runs on job 0's ranks (no start-up): reported at once, not at its timeout. The hang ends
    # at its timeout (its fresh ranks' start-up included), and then at once.
    assert took[1] < timeout / 2, (took, timeout)
    assert timeout <= took[2] < 1.5 * timeout, (took, timeout)
    assert counts == {"ok": 2, "failed": 2, "skipped": 0}
    records = read_records(out)
    assert [r["status"] for r in records] == ["ok", "failed", "failed", "ok"]
    assert "rank 1 of 2 raised" in records[1]["error"] and "injected failure" in records[1]["error"]
    assert f"rank(s) [0, 1] did not finish within {timeout:.0f} s" in records[2]["error"]  # rank 1 waits for rank 0
    assert lines[0].startswith("[1/4] ") and [line.split()[:2] for line in lines[1:3]] == [["[2/4]", "FAILED"],
                                                                                          ["[3/4]", "FAILED"]]
    assert lines[3].startswith("[4/4] ")  # progress on every line, although stderr is no terminal here
    for pid in records[0]["pids"] + records[3]["pids"]:  # no rank process is left behind
        assert not alive(pid), f"process {pid} outlived the sweep"


@pytest.mark.slow
@pytest.mark.timeout(900)  # beside other work, start-up and 5 configs take minutes
def test_ctrl_c_stops_cleanly_and_resume_continues(tmp_path):
    out = tmp_path / "r.jsonl"
    # Configs long enough (a second or more each) that the interrupt, sent within 0.1 s of the first
    # record, surely lands before the last one ends.
    argv = [sys.executable, "-m", "experiments", "run", *TINY, "--iters", "40", "--bucket-mb", "0,1,2,3,25",
            "--out", str(out)]
    # SIGINT back to its default in the child: a suite started as a background job inherits it ignored,
    # and Python then installs no Ctrl-C handler at all.
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    while proc.poll() is None and (not out.exists() or not out.read_text().strip()):  # the first config's record
        time.sleep(0.1)
    assert proc.poll() is None, proc.communicate()  # (pytest's timeout ends a run that records nothing)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 130, err
    assert "add --resume to continue" in err
    finished = len(read_records(out))
    assert 1 <= finished < 5
    done = subprocess.run([*argv, "--resume"], cwd=ROOT, capture_output=True, text=True, timeout=480)
    assert done.returncode == 0, done.stderr
    assert f"{5 - finished} ok, 0 failed, {finished} skipped" in done.stdout
    assert sorted(r["config"]["bucket_mb"] for r in read_records(out)) == [0, 1, 2, 3, 25]


@pytest.mark.timeout(300)
def test_allreduce_microbenchmark_checks_every_row(tmp_path):
    out = tmp_path / "a.jsonl"
    assert main(["allreduce", "--total", "65536", "--per-call", "1024,65536", "--sizes", "4096,262144",
                 "--reps", "2", "--warmup", "1", "--out", str(out)]) == 0
    records = read_records(out)
    assert [r["config"]["mode"] for r in records] == ["granularity", "granularity", "size", "size"]
    assert all(r["correct"] and r["wrong"] == 0 for r in records)
    assert [r["summary"]["calls"] for r in records] == [64, 1, 1, 1]
    size_row = records[3]["summary"]
    assert size_row["busbw_GBps"] == pytest.approx(size_row["algbw_GBps"] * 2 * (2 - 1) / 2)


@pytest.mark.timeout(300)
def test_convergence_mode_records_a_falling_loss_per_sync_every(tmp_path):
    out = tmp_path / "t.jsonl"
    assert main(["train", "--sync-every", "1,4", "--iters", "120", "--out", str(out)]) == 0
    records = read_records(out)
    assert [r["config"]["sync_every"] for r in records] == [1, 4]
    for r in records:
        assert len(r["loss"]) == 120
        assert sum(r["loss"][-10:]) < 0.7 * sum(r["loss"][:10]), r["config"]
        assert r["summary"]["accuracy"] > 0.3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(args: list[str], log: Path, nodes: int = 1, node_args=lambda node: []) -> list[subprocess.Popen]:
    """`nodes` torchrun agents of `python -m experiments ARGS`, their output in `log` with the node's number."""
    return [
        subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", *node_args(node), "-m", "experiments", *args],
            cwd=ROOT, stdout=log.with_suffix(f".{node}.log").open("w"), stderr=subprocess.STDOUT,
            env={**os.environ, "TMPDIR": str(log.parent)},  # torchrun's own log folders: not left in /tmp
        )
        for node in range(nodes)
    ]


def _wait_for_agents(agents: list[subprocess.Popen], log: Path, seconds: float) -> list[str]:
    """Wait for the agents (killing any left after `seconds`); their logs, headed by their exit status."""
    deadline = time.monotonic() + seconds
    try:
        for agent in agents:
            agent.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass  # reported by the caller, with every agent's output (a hang has been seen at an agent's exit)
    finally:
        for agent in agents:  # never leave an agent behind, even after a timeout
            agent.kill()
            agent.wait()
    return [f"--- agent {node} (exit {a.returncode}):\n" + log.with_suffix(f".{node}.log").read_text()
            for node, a in enumerate(agents)]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_torchrun_agents_record_what_the_built_in_launcher_records(tmp_path, capsys):
    """Two torchrun "nodes" on loopback, joined by a c10d rendezvous (in the form docs/gpu-cluster.md
    gives: no --node-rank, which c10d ignores with a warning), run the same sweep. Their ranks share
    this host's cores: with as many threads per rank as it has cores, the built-in launcher's
    oversubscription warning is given (once, by rank 0), and only the agent of rank 0 names the records."""
    cores = os.cpu_count() or 1
    sweep = ["run", *TINY, "--world-size", "2", "--impl", "ddp_core,torch", "--threads", str(cores)]
    builtin = tmp_path / "builtin.jsonl"
    capsys.readouterr()
    assert main([*sweep, "--out", str(builtin)]) == 0
    warning = f"2 ranks x {cores} threads per rank = {2 * cores} threads on {cores} cores"
    assert warning in capsys.readouterr().err
    out, port = tmp_path / "torchrun.jsonl", _free_port()
    agents = _torchrun([*sweep, "--out", str(out)], tmp_path / "agent", nodes=2, node_args=lambda node: [
        "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
        # Both agents are on one host: say which one hosts the rendezvous store, or they may race.
        "--rdzv-conf", f"is_host={int(node == 0)}", "--rdzv-id", "ddpbench-test", "--max-restarts", "0"])
    logs = _wait_for_agents(agents, tmp_path / "agent", 240)
    assert all(a.returncode == 0 for a in agents), "\n".join(logs)
    expected, got = read_records(builtin), read_records(out)
    assert [r["config"] for r in got] == [r["config"] for r in expected]
    assert all(r["status"] == "ok" and r["correct"] and len(r["latency_s"]) == 3 for r in got)
    both = "\n".join(logs)
    assert both.count(warning) == 1, both  # rank 0's, for the one host both agents share
    assert sum("records in" in log for log in logs) == 1, both  # the agent of rank 0 alone
    assert "will be ignored" not in both, both  # torchrun's node_rank warning


@pytest.mark.timeout(120)
def test_a_world_size_torchrun_does_not_have_is_reported_once_in_one_line(tmp_path):
    out = tmp_path / "torchrun.jsonl"
    agents = _torchrun(["run", *TINY, "--world-size", "3", "--out", str(out)], tmp_path / "agent",
                       node_args=lambda node: ["--standalone", "--nproc-per-node", "2", "--max-restarts", "0"])
    log = _wait_for_agents(agents, tmp_path / "agent", 100)[0]
    assert agents[0].returncode != 0, log
    assert log.count("--world-size must be 2 under torchrun") == 1, log  # rank 0's line, not one per rank
    assert "ddpbench run: error: --world-size must be 2 under torchrun, torchrun's world size" in log, log
    assert "exitcode  : 2" in log, log  # the ranks' status for bad input, as torchrun reports it
    assert "ValueError" not in log and "[rank0]: Traceback" not in log and "[rank1]: Traceback" not in log, log
    assert not out.exists()
