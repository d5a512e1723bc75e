"""The experiment runner: grid, validation, records, resume, faults, and tiny end-to-end sweeps."""
import dataclasses
import json
import os

import pytest

from experiments.cli import main
from experiments.core.config import ConfigError, RunConfig
from experiments.core.records import SchemaError, append_record, load_records, read_records
from experiments.core.stats import phase_medians, slowest_rank_per_cycle
from experiments.measure.configs import expand_grid, validate

TINY = ["--model", "resnet-tiny", "--image-size", "16", "--batch-size", "2", "--iters", "3", "--warmup", "1"]


def test_grid_is_the_cartesian_product_grouped_by_world_size():
    configs = expand_grid({"world_size": [2, 1], "bucket_mb": [0.0, 25.0], "impl": ["ddp_core", "torch"]})
    assert len(configs) == 8
    assert [c.world_size for c in configs] == [1] * 4 + [2] * 4  # one pool of ranks per world size
    assert expand_grid({"bucket_mb": [1.0, 1.0]}) == [RunConfig(bucket_mb=1.0)]


@pytest.mark.parametrize("argv, needle", [
    (["--model", "resnet51"], "--model='resnet51' is not allowed; choose one of .*resnet50"),
    (["--backend", "nccl", "--device", "cpu"], "--backend nccl needs --device cuda"),
    (["--bucket-mb", "-1"], "--bucket-mb=-1.0 is not allowed; it must be >= 0"),
    (["--sync-every", "0"], "--sync-every=0 is not allowed; it must be >= 1"),
    (["--iters", "0"], "--iters=0 is not allowed; it must be >= 1"),
    (["--world-size", "two"], "--world-size: 'two' is not a valid int"),
    (["--impl", "horovod"], "--impl='horovod' is not allowed"),
    (["--timeout", "0"], "--timeout=0.0 is not allowed; it must be > 0"),
])
def test_bad_input_exits_2_naming_parameter_and_value_and_writes_nothing(tmp_path, capsys, argv, needle):
    out = tmp_path / "records.jsonl"
    assert main(["run", *argv, "--out", str(out)]) == 2
    import re
    assert re.search(needle, capsys.readouterr().err), capsys.readouterr
    assert not out.exists()


def test_unwritable_output_is_rejected_before_running(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    assert main(["run", *TINY, "--out", str(blocker / "records.jsonl")]) == 2
    assert "cannot create it" in capsys.readouterr().err


@pytest.mark.parametrize("where", ["out", "trace"])
def test_every_write_target_is_checked_before_any_rank_starts(tmp_path, capsys, where):
    out = tmp_path / "records.jsonl"
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    bad = {"out": ["--out", "/proc/x.jsonl"], "trace": ["--out", str(out), "--trace", str(blocker)]}[where]
    assert main(["run", *TINY, *bad]) == 2
    assert f"ddpbench run: error: --{where}=" in capsys.readouterr().err  # the exit-2 message, no traceback
    assert main(["run", *TINY, "--out", str(out), "--trace", "/proc/traces"]) == 2
    assert "--trace='/proc/traces': cannot create it under '/proc'" in capsys.readouterr().err
    assert not out.exists()


def test_ab_and_history_check_their_output_folders(capsys):
    assert main(["ab", "HEAD", "--keep", "/proc/ab-records"]) == 2
    assert "--keep='/proc/ab-records': cannot create it" in capsys.readouterr().err
    assert main(["history", "HEAD", "--results", "/proc/results"]) == 2
    assert "--results='/proc/results': cannot create it" in capsys.readouterr().err


def test_ab_refuses_options_of_the_other_mode_before_anything_runs(capsys):
    for argv, message in ((["--rounds", "5"], "--rounds=5 has no effect with --interleave iterations"),
                          (["--busy-retries", "0"], "--busy-retries=0 has no effect with --interleave iterations"),
                          (["--interleave", "processes", "--seconds", "5"], "--seconds=5.0 has no effect"),
                          (["--seconds", "inf"], "--seconds=inf is not allowed"),
                          (["--interleave", "processes", "--rounds", "2"], "--rounds=2 is not allowed")):
        assert main(["ab", "HEAD", *argv]) == 2
        assert message in capsys.readouterr().err


def test_help_lists_allowed_values_and_describes_every_option(capsys):
    from experiments.cli import build_parser

    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for allowed in ("bert-base, bert-tiny, resnet-tiny, resnet50",
                    "torch (PyTorch's DistributedDataParallel), ddp_core (this project's rebuild of the paper's "
                    "system), ddp_core_no_overlap (ddp_core reducing after backward); default 'torch'",
                    "none, allreduce, fp16, bf16", "nccl, gloo, mpi",
                    "cpu, cuda"):
        assert allowed in text, allowed
    commands = build_parser().parse_args(["run", "--out", "x"]).subcommands
    for name in ("allreduce", "train"):
        for action in commands[name]._actions:
            assert action.help, f"ddpbench {name} {action.option_strings} has no description"


def test_an_unknown_option_prints_the_sub_commands_usage(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--bogus", "1", "--out", "x.jsonl"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: ddpbench train") and "unrecognized arguments: --bogus 1" in err


def test_nccl_world_size_above_gpu_count_is_rejected():
    with pytest.raises(ConfigError, match="--world-size=4 exceeds the 2 GPU"):
        validate(RunConfig(backend="nccl", device="cuda", world_size=4), gpu_count=2)


def test_records_round_trip_into_a_dataframe_and_refuse_unknown_versions(tmp_path):
    path = tmp_path / "r.jsonl"
    record = {"kind": "run", "status": "ok", "config": {"model": "m", "bucket_mb": 1.0},
              "summary": {"p50": 0.5}, "phases_s": {"forward": [[0.1, 0.3]], "optimizer": [[0.2, 0.2]]},
              "env": {"host": "h"}}
    append_record(path, record)
    append_record(path, {**record, "config": {"model": "m", "bucket_mb": 2.0}})
    frame = load_records(path)
    assert list(frame["bucket_mb"]) == [1.0, 2.0]
    assert list(frame["summary_p50"]) == [0.5, 0.5] and list(frame["forward_s"]) == [0.2, 0.2]
    with open(path, "a") as f:
        f.write('{"schema_version": 1, "kind": "run", "sta')  # a torn last line
    with pytest.warns(UserWarning, match="torn last line"):
        assert len(read_records(path)) == 2
    bad = tmp_path / "old.jsonl"
    bad.write_text(json.dumps({"schema_version": 99, "kind": "run"}) + "\n")
    with pytest.raises(SchemaError, match="schema_version 99, but this ddpbench reads versions 1 and 2"):
        read_records(bad)


def test_a_cycle_of_skipped_iterations_takes_as_long_as_its_slowest_rank():
    # rank 1 lags in the skipped iterations; rank 0 waits for it at the synchronised third one
    rank0, rank1 = [0.1, 0.1, 0.55], [0.2, 0.2, 0.4]
    assert slowest_rank_per_cycle([rank0, rank1], 3) == [1, 1, 1]  # 0.8 s per cycle, not 0.2 + 0.2 + 0.55
    assert slowest_rank_per_cycle([rank0, rank1], 1) == [1, 1, 0]
    assert slowest_rank_per_cycle([rank0[:2], rank1[:2]], 3) == [1, 1]  # a last, incomplete cycle


def test_phase_medians_come_from_the_rank_that_set_each_iteration():
    # phase -> rank -> iteration. Iteration 0: rank 1 computes slowly and rank 0 waits for it in
    # exposed_comm, then steps its optimizer faster (0.65 s in all, rank 1 0.7 s); iteration 1: the reverse.
    phases = {"forward": [[0.1, 0.1], [0.1, 0.1]], "backward": [[0.2, 0.5], [0.5, 0.2]],
              "exposed_comm": [[0.3, 0.0], [0.0, 0.3]], "optimizer": [[0.05, 0.1], [0.1, 0.05]]}
    medians = phase_medians(phases, 1)
    assert medians["backward"] == pytest.approx(0.5) and medians["exposed_comm"] == pytest.approx(0.0)
    assert sum(medians.values()) == pytest.approx(0.7)  # the maximum per phase would add up to 1.0
    torch_like = dict(phases, exposed_comm=[[None, None], [None, None]])
    assert phase_medians(torch_like, 1)["exposed_comm"] is None


def test_the_timing_log_keeps_this_machines_timings_skips_a_torn_line_and_is_bounded(tmp_path, monkeypatch):
    from experiments.measure import timing_log
    from experiments.measure.dryrun import estimate

    config = dataclasses.asdict(RunConfig(iters=10, warmup=2))
    timing = {"setup_s": 1.0, "warmup_s": 0.2, "measured_s": 1.0, "config_wall_s": 2.5, "cores_busy": 1.0}
    record = {"kind": "run", "status": "ok", "config": config, "timing": timing,
              "env": {"machine_id": "mine", "time": "2026-01-01T00:00:00Z"}}
    timing_log.append(record, tmp_path)
    timing_log.append({**record, "env": {"machine_id": "another"}}, tmp_path)
    timing_log.append({**record, "status": "failed"}, tmp_path)  # no timing of a failed config is kept
    with open(timing_log.log_path(tmp_path), "ab") as log:
        log.write(b'{"config": {"iters": 3')  # a crash in the middle of a line
    logged = timing_log.read("mine", tmp_path)
    assert len(logged) == 1 and timing_log.read("nobody", tmp_path) == []
    assert estimate(config, logged) == (pytest.approx(2.5), 1)
    assert estimate({**config, "iters": 20}, logged)[0] == pytest.approx(3.5)  # 1 s more of measuring
    timing_log.append(record, tmp_path)  # after the torn line: still read
    assert len(timing_log.read("mine", tmp_path)) == 2
    # bounded: past MAX_BYTES the log becomes timings.log.1 (the one before it dropped), and both are read
    monkeypatch.setattr(timing_log, "MAX_BYTES", 1)
    for _ in range(3):
        timing_log.append(record, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["timings.log", "timings.log.1"]
    assert len(timing_log.read("mine", tmp_path)) == 2


def test_a_timing_log_that_cannot_be_written_is_said_once_and_the_run_goes_on(tmp_path, monkeypatch, capsys):
    from experiments.measure import timing_log

    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setattr(timing_log, "_warned", False)
    record = {"kind": "run", "status": "ok", "config": {"iters": 1, "warmup": 0}, "env": {"machine_id": "mine"},
              "timing": {"setup_s": 1.0, "warmup_s": 0.0, "measured_s": 1.0, "config_wall_s": 2.0}}
    timing_log.append(record, blocker / "runs")
    timing_log.append(record, blocker / "runs")
    assert capsys.readouterr().err.count("cannot add to the timing log") == 1


def test_other_processes_keeping_cores_busy_are_told_apart_from_the_ranks():
    from experiments.measure.sweep import BusyConfigs, other_cores_busy

    def rank(host, own, busy=None, wall=2.0):
        return {"load": {"host": host, "own_cpu_s": own, "machine_busy_s": busy, "measuring_s": wall}}

    # 3 core-seconds busy over 2 s, the two ranks of this host used 2 of them: 0.5 cores were others'
    assert other_cores_busy([rank("a", 1.0, 3.0), rank("a", 1.0)]) == pytest.approx(0.5)
    # a rank on another host (torchrun) used none of this host's cores
    assert other_cores_busy([rank("a", 1.0, 3.0), rank("b", 1.0)]) == pytest.approx(1.0)
    assert other_cores_busy([rank("a", 1.5, 2.0), rank("a", 1.0)]) == 0.0  # never below zero
    assert other_cores_busy([rank("a", 1.0, None)]) is None and other_cores_busy([{}]) is None
    busy = BusyConfigs()
    assert busy.mark({"timing": {"other_cores_busy": 0.1}, "env": {"cpu_count": 2}}, "[1/3] seed=1") == ""
    assert busy.warning(1) is None  # a quiet run says nothing
    assert busy.mark({"timing": {"other_cores_busy": 0.5}, "env": {"cpu_count": 2}}, "[2/3] seed=2") == \
        " (busy 0.5 cores)"
    assert busy.warning(2).startswith("ddpbench: warning: other processes kept 0.5 of 2 cores busy while [2/3] "
                                      "seed=2 was measured")
    busy.mark({"timing": {"other_cores_busy": 1.04}, "env": {"cpu_count": 2}}, "[3/3] seed=3")
    # one warning for the run: how many configs, the worst figure, and its config
    assert busy.warning(3).startswith("ddpbench: warning: other processes kept cores busy while 2 of 3 configs were "
                                      "measured (marked 'busy'; the most, 1.0 of 2 cores, during [3/3] seed=3)")


def test_stderr_without_drops_only_the_lines_holding_its_needle(capfd):
    from experiments.measure.launch import stderr_without

    os.write(2, b"before\n")  # (file descriptor 2, where c10d's C++ logs go)
    with stderr_without(b"cannot be retrieved"):
        os.write(2, b"[W] keep this\n[W] [c10d] The hostname ... cannot be retrieved. err=-3\nand this\n")
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "before\n[W] keep this\nand this\nafter\n"


def test_summary_lines_show_what_differs_and_warnings_say_what_is_wrong(tmp_path, capsys):
    from experiments.measure.sweep import summary_line, varying_fields, warn_already_recorded, warn_oversubscribed

    jobs = [RunConfig(threads=1), RunConfig(threads=2)]
    records = [{"status": "ok", "config": dataclasses.asdict(job), "summary": {"p50": 0.01}} for job in jobs]
    lines = [summary_line(record, varying_fields(jobs)) for record in records]
    assert lines[0] != lines[1] and "threads=1" in lines[0] and "threads=2" in lines[1]
    assert "iters=" not in lines[0]  # shown only where it varies
    assert warn_oversubscribed(jobs, cores=2) == [capsys.readouterr().err.strip()]
    assert "2 ranks x 2 threads per rank = 4 threads on 2 cores" in warn_oversubscribed(jobs, cores=2)[0]
    assert warn_oversubscribed([RunConfig(threads=1)], cores=2) == []
    out = tmp_path / "r.jsonl"
    capsys.readouterr()
    warn_already_recorded(jobs, out)  # no file yet: nothing to say
    append_record(out, records[1])
    warn_already_recorded(jobs, out)
    assert "already holds records of 1 of these 2 configs; they are measured again and appended" in \
        capsys.readouterr().err


def test_ctrl_c_before_any_config_finished_does_not_point_to_records(tmp_path, capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("experiments.measure.sweep.run_sweep", interrupted)
    out = tmp_path / "r.jsonl"
    assert main(["run", *TINY, "--out", str(out)]) == 130
    err = capsys.readouterr().err
    assert "interrupted before any config finished; nothing was added to" in err and "--resume" not in err


def test_ctrl_c_in_a_step_of_the_main_job_stops_the_job(tmp_path, monkeypatch):
    from experiments import cli

    steps = []

    def interrupted_step(step, out):
        steps.append(step.command)
        return 130  # what a step returns after Ctrl-C (and it then ignores Ctrl-C until its process exits)

    monkeypatch.setattr(cli, "run_step", interrupted_step)
    assert cli.main_job(cli.MainJobOptions(tmp_path, "smoke")) == 130
    assert len(steps) == 1, steps  # the job's next steps did not run
