"""How ranks start (experiments.measure.launch): forked from a fork server that imported torch once, yet
with what a freshly started process would have (the parent's environment and output as of the pool's
start), counted as this run's CPU time, and gone when the run is killed outright."""
import os
import signal
import subprocess
import sys
import tempfile
import textwrap

from experiments.core.machine import descendants_cpu_seconds
from experiments.measure.launch import RankPool, run_ranks
from tests.processes import alive, burn_cpu, rank_facts, wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_ranks_see_the_environment_and_output_the_parent_has_when_the_pool_starts(monkeypatch):
    run_ranks(rank_facts, 1, ("DDPBENCH_TEST_LATER",))  # the fork server runs from here on, if not before
    monkeypatch.setenv("DDPBENCH_TEST_LATER", "set after the server started")
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        saved = os.dup(1), os.dup(2)
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        try:
            facts = run_ranks(rank_facts, 2, ("DDPBENCH_TEST_LATER",))
        finally:
            for fd, saved_fd in zip((1, 2), saved):
                os.dup2(saved_fd, fd)
                os.close(saved_fd)
        out.seek(0), err.seek(0)
        printed, errors = out.read().decode(), err.read().decode()
    assert [value for _, _, value in facts] == ["set after the server started"] * 2
    assert all(f"rank {r} says hello on stdout" in printed for r in (0, 1)), printed
    assert all(f"rank {r} says hello on stderr" in errors for r in (0, 1)), errors
    assert all(parent != os.getpid() for _, parent, _ in facts)  # forked by the server, not by this process


def test_the_ranks_cpu_time_counts_as_this_processs_while_they_run_and_after_a_child_run_ended():
    with RankPool(2) as pool:
        before = descendants_cpu_seconds()
        used = sum(pool.run(burn_cpu, (0.5,)))
        assert descendants_cpu_seconds() - before >= 0.9 * used
    # A child run (as an A/B round is): its fork server and ranks are waited for before it exits, so
    # their time reaches this process (getrusage) instead of going to nobody's account.
    script = textwrap.dedent("""
        from experiments.measure.launch import run_ranks
        from tests.processes import burn_cpu
        print(sum(run_ranks(burn_cpu, 2, (0.5,))))
    """)
    before = descendants_cpu_seconds()
    child = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr
    assert descendants_cpu_seconds() - before >= 0.9 * float(child.stdout)


def test_ranks_end_with_a_run_killed_outright(tmp_path):
    script = textwrap.dedent("""
        import time
        from experiments.measure.launch import RankPool
        from tests.processes import rank_facts
        with RankPool(2) as pool:
            print("ranks", *[pid for pid, _, _ in pool.run(rank_facts, ("HOME",))], flush=True)
            time.sleep(600)  # the ranks wait for their next task
    """)
    # Its temporary files here: a run killed outright leaves multiprocessing's folder (the fork server's socket).
    run = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                           env={**os.environ, "TMPDIR": str(tmp_path)})
    try:
        line = next(line for line in run.stdout if line.startswith("ranks "))
        ranks = [int(pid) for pid in line.split()[1:]]
        assert len(ranks) == 2 and all(alive(pid) for pid in ranks)
    finally:
        run.kill()  # SIGKILL, this process only: no clean-up of its own runs
        run.communicate()
    wait_for(lambda: not any(alive(pid) for pid in ranks), 30)
