"""`predict --trace` / `tune-bucket --trace`: a torch.profiler trace of the user's own loop read as a profile."""
import json

import pytest
import torch
from torch import nn

from experiments.cli import main
from experiments.perfmodel.trace import HOW_TO_RECORD, TraceError, read_trace


def _model() -> nn.Module:
    """Two linear layers and a batch norm: 6 gradients (4 of the linears, 2 of the norm)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 4))


def _loop(prof, iterations: int, accumulate: int = 1, step_marks: bool = True) -> nn.Module:
    """A user-style loop: make data, forward, backward (maybe several micro-batches), clip, step."""
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(iterations):
        for _ in range(accumulate):
            x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
            (nn.functional.cross_entropy(model(x), y) / accumulate).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step_marks:
            prof.step()
    return model


def _trace(path, shapes=True, step_marks=True, accumulate=1):
    """Run the loop under torch.profiler (CPU) and export the trace to `path`."""
    schedule = torch.profiler.schedule(wait=1, warmup=1, active=3) if step_marks else None
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=shapes,
                                schedule=schedule) as prof:
        model = _loop(prof, 5 if step_marks else 3, accumulate, step_marks)
    prof.export_chrome_trace(str(path))
    return model


@pytest.fixture(scope="module")
def cpu_trace(tmp_path_factory):
    """A real CPU trace of the loop, 4 active iterations with ProfilerStep markers."""
    path = tmp_path_factory.mktemp("trace") / "loop.json"
    model = _trace(path)
    return path, model


def test_a_real_cpu_trace_gives_every_gradient_its_size_and_ready_time(cpu_trace):
    path, model = cpu_trace
    trace = read_trace(path)
    p = trace.profile
    sizes = sorted(q.numel() * 4 for q in model.parameters())
    assert sorted(p.nbytes) == sizes and len(trace.gradients) == 6
    assert set(p.dtypes) == {"torch.float32"}
    # AccumulateGrad fires from the output layer back: the last linear's weight/bias first, its input layer last
    assert trace.gradients[-1].shape in ((32, 16), (32,)) and trace.gradients[0].shape in ((4, 32), (4,))
    assert list(p.ready) == sorted(p.ready) and 0 < p.ready[-1] <= p.backward
    assert len(trace.steps) >= 3 and trace.steps[0].startswith("ProfilerStep#")
    assert p.forward > 0 and p.backward > 0 and p.optimizer > 0 and p.tail > 0  # clipping runs after backward
    assert trace.other > 0  # making the data is neither forward nor backward
    assert p.buffer_bytes == 2 * 32 * 4  # the batch norm's running mean and variance


def test_predict_and_tune_bucket_from_a_trace_say_which_gradient_each_bucket_waits_for(cpu_trace, capsys):
    path, _ = cpu_trace
    assert main(["predict", "--trace", str(path), "--cluster", "paper-v100-nccl", "--world-size", "2,8",
                 "--bucket-mb", "0"]) == 0
    out = capsys.readouterr().out
    assert "trace:" in out and "waits for gradient #" in out and "other" in out
    assert out.count("bucket 0:") == 2  # one list per schedule
    assert main(["tune-bucket", "--trace", str(path), "--cluster", "paper-v100-nccl", "--world-size", "8",
                 "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["recommended_bucket_mb"] in [row["bucket_mb"] for row in result["predictions"]]
    row = result["predictions"][0]
    assert row["latency_ms"] > row["forward_ms"] + row["backward_ms"] + row["other_ms"]
    assert result["trace"]["buckets"][0]["bucket_mb"] == result["recommended_bucket_mb"]
    assert len(result["trace"]["gradients"]) == 6


def test_the_other_phase_is_added_to_the_prediction_unchanged(cpu_trace, capsys):
    path, _ = cpu_trace
    argv = ["predict", "--trace", str(path), "--cluster", "paper-v100-nccl", "--json"]
    assert main(argv) == 0
    row = json.loads(capsys.readouterr().out)["predictions"][0]
    parts = sum(row[k] for k in ("forward_ms", "backward_ms", "exposed_comm_ms", "tail_ms", "optimizer_ms", "other_ms"))
    assert row["latency_ms"] == pytest.approx(parts)


def test_gradient_accumulation_keeps_earlier_micro_batches_apart(tmp_path):
    path = tmp_path / "acc.json"
    _trace(path, accumulate=3)
    trace = read_trace(path)
    assert len(trace.gradients) == 6  # the synchronised (last) pass only
    assert trace.accumulate > 0  # two earlier micro-batches' forward and backward, apart from the last one's


def test_without_step_markers_iterations_run_from_one_optimizer_step_to_the_next(tmp_path):
    path = tmp_path / "nosteps.json"
    _trace(path, step_marks=False)
    trace = read_trace(path)
    assert len(trace.steps) == 2 and trace.steps[0] == "iteration 1"  # 3 optimizer steps: 2 whole iterations
    assert len(trace.gradients) == 6


def _refused(path, capsys, needle):
    """predict --trace on `path` exits 2 with one line naming what is missing and how to record."""
    assert main(["predict", "--trace", str(path), "--cluster", "paper-v100-nccl"]) == 2
    err = capsys.readouterr().err
    assert needle in err and "record_shapes=True" in err and "prof.step()" in err and "--trace=" in err
    assert len(err.strip().splitlines()) == 1


def test_a_trace_without_shapes_is_refused_with_what_to_record(tmp_path, capsys):
    path = tmp_path / "noshapes.json"
    _trace(path, shapes=False)
    _refused(path, capsys, "no tensor shapes")


def test_a_trace_without_steps_is_refused_with_what_to_record(tmp_path, capsys):
    path = tmp_path / "onestep.json"
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        _loop(prof, 1, step_marks=False)  # one optimizer step, no ProfilerStep: no whole iteration
    prof.export_chrome_trace(str(path))
    _refused(path, capsys, "no step markers")


def test_a_trace_of_several_processes_is_refused(cpu_trace, tmp_path, capsys):
    data = json.loads(cpu_trace[0].read_text())
    ops = [e for e in data["traceEvents"] if e.get("cat") == "cpu_op"]
    copies = [dict(e, pid=12345) for e in ops]  # a second rank's events merged into one file
    data["traceEvents"] += copies
    path = tmp_path / "merged.json"
    path.write_text(json.dumps(data))
    _refused(path, capsys, "2 processes")


def test_a_file_that_is_not_a_trace_exits_2(tmp_path, capsys):
    path = tmp_path / "bad.json"
    path.write_text("{not json")
    assert main(["predict", "--trace", str(path), "--cluster", "paper-v100-nccl"]) == 2
    assert "is not JSON" in capsys.readouterr().err
    assert main(["predict", "--trace", str(tmp_path / "missing.json"), "--cluster", "paper-v100-nccl"]) == 2
    assert main(["predict", "--trace", str(cpu := tmp_path / "bad.json"), "--cluster", "paper-v100-nccl",
                 "--batch-size", "4"]) == 2
    assert "--batch-size" in capsys.readouterr().err and cpu.exists()


def test_predict_with_a_profile_still_needs_a_model(tmp_path, capsys):
    assert main(["predict", "--profile", str(tmp_path), "--cluster", "paper-v100-nccl"]) == 2
    assert "--model is required with --profile" in capsys.readouterr().err


def _cuda_trace() -> dict:
    """A CUDA-shaped Kineto trace: CPU ops launch kernels (cudaLaunchKernel, matched by correlation) that
    run on the GPU (pid 0) later and longer than the CPU ops; backward runs on the autograd device thread."""
    events, corr = [], [0]
    main_tid, bwd_tid = 100, 200

    def op(name, tid, ts, dur, cat="cpu_op", **args):
        events.append({"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args})

    def launch(tid, ts, gpu_start, gpu_dur):
        corr[0] += 1
        op("cudaLaunchKernel", tid, ts, 2, cat="cuda_runtime", correlation=corr[0])
        events.append({"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": gpu_start, "dur": gpu_dur,
                       "args": {"correlation": corr[0], "device": 0, "stream": 7}})

    for step in range(3):
        t = 10_000 * step  # microseconds
        op(f"ProfilerStep#{step + 1}", main_tid, t, 9_000, cat="user_annotation")
        op("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", main_tid, t + 10, 990,
           cat="user_annotation")
        # forward: two ops, CPU 1000..1300 us; their kernels run 1100..3100 us
        op("aten::linear", main_tid, t + 1000, 100, **{"Sequence number": 10 + step * 10, "Input Dims": [[8, 16]]})
        launch(main_tid, t + 1050, t + 1100, 900)
        op("aten::linear", main_tid, t + 1200, 100, **{"Sequence number": 11 + step * 10, "Input Dims": [[8, 32]]})
        launch(main_tid, t + 1250, t + 2100, 1000)
        # backward on the autograd thread: CPU 1400..1800 us, kernels 3200..6200 us
        for i, (seq, shape, gpu_start) in enumerate(((11, [4, 32], 3200), (10, [32, 16], 4700))):
            node = t + 1400 + 200 * i
            op("autograd::engine::evaluate_function: AddmmBackward0", bwd_tid, node, 100,
               **{"Sequence number": seq + step * 10, "Fwd thread id": 1})
            launch(bwd_tid, node + 50, t + gpu_start, 1500)
            op("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", bwd_tid, node + 110, 60)
            op("torch::autograd::AccumulateGrad", bwd_tid, node + 115, 50,
               **{"Input Dims": [shape], "Input type": ["c10::BFloat16"]})
        # optimizer: CPU 2000..2200 us, its kernel 6300..6800 us
        op("Optimizer.step#AdamW.step", main_tid, t + 2000, 200, cat="user_annotation")
        launch(main_tid, t + 2100, t + 6300, 500)
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "Synthetic GPU"}], "traceEvents": events}


def test_a_cuda_trace_takes_its_times_from_the_kernels(tmp_path):
    path = tmp_path / "cuda.json"
    path.write_text(json.dumps(_cuda_trace()))
    trace = read_trace(path)
    p = trace.profile
    assert trace.device == "cuda" and p.config["device"] == "cuda"
    assert p.forward == pytest.approx(2.0e-3)  # kernels 1100..3100 us, not the CPU's 300 us
    assert p.backward == pytest.approx(3.0e-3)  # kernels 3200..6200 us
    assert p.ready == pytest.approx((1.5e-3, 3.0e-3))  # each gradient when its kernel has finished
    assert p.optimizer == pytest.approx(0.5e-3)
    assert p.nbytes == (4 * 32 * 2, 32 * 16 * 2) and p.dtypes == ("torch.bfloat16", "torch.bfloat16")
    assert trace.other == pytest.approx(9.0e-3 - 2.0e-3 - 3.0e-3 - 0.5e-3)
    assert trace.data == pytest.approx(0.99e-3)


def test_the_refusal_quotes_the_three_profiler_lines():
    assert "record_shapes=True" in HOW_TO_RECORD and "prof.step()" in HOW_TO_RECORD
    assert "export_chrome_trace" in HOW_TO_RECORD
    assert issubclass(TraceError, ValueError)


def test_a_trace_of_another_gpu_than_the_clusters_is_warned_about(tmp_path, capsys):
    path = tmp_path / "cuda.json"
    path.write_text(json.dumps(_cuda_trace()))  # "Synthetic GPU"
    assert main(["predict", "--trace", str(path), "--cluster", "dgx-h100-nccl"]) == 0
    err = capsys.readouterr().err
    assert "the trace is of Synthetic GPU" in err and "H100" in err and "--compute-s" in err
    assert main(["predict", "--trace", str(path), "--cluster", "dgx-h100-nccl", "--compute-s", "0.01"]) == 0
    assert "warning" not in capsys.readouterr().err
    data = _cuda_trace()
    data["deviceProperties"][0]["name"] = "NVIDIA H100 80GB HBM3"
    path.write_text(json.dumps(data))
    assert main(["predict", "--trace", str(path), "--cluster", "dgx-h100-nccl"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_compute_s_scales_the_traced_compute_and_leaves_other_as_it_is(tmp_path, capsys):
    path = tmp_path / "cuda.json"
    path.write_text(json.dumps(_cuda_trace()))
    assert main(["predict", "--trace", str(path), "--cluster", "paper-v100-nccl", "--compute-s", "0.011",
                 "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["predictions"][0]
    compute = row["forward_ms"] + row["backward_ms"] + row["tail_ms"] + row["optimizer_ms"]
    assert compute == pytest.approx(11.0, rel=0.01)  # 5.5 ms traced, doubled (forward includes a broadcast)
    assert row["other_ms"] == pytest.approx(3.5)  # data loading does not get faster on another device


@pytest.mark.parametrize("ranks, warned", [(4, True), (1, False)])
def test_a_trace_made_under_ddp_with_other_ranks_is_warned_about(cpu_trace, tmp_path, capsys, ranks, warned):
    data = json.loads(cpu_trace[0].read_text())
    data["distributedInfo"] = {"backend": "gloo", "rank": 0, "world_size": ranks}
    step = next(e for e in data["traceEvents"] if e.get("name", "").startswith("ProfilerStep#"))
    data["traceEvents"].append({"ph": "X", "cat": "cpu_op", "name": "gloo:all_reduce", "pid": step["pid"],
                                "tid": step["tid"], "ts": step["ts"] + 1, "dur": 1, "args": {}})
    path = tmp_path / "ddp.json"
    path.write_text(json.dumps(data))
    assert main(["predict", "--trace", str(path), "--cluster", "paper-v100-nccl", "--compute-s", "0.01"]) == 0
    assert ("traced under DDP with 4 ranks" in capsys.readouterr().err) == warned


def test_advise_from_a_trace_predicts_what_predict_does_and_writes_its_report(cpu_trace, tmp_path, capsys):
    path, _ = cpu_trace
    out = tmp_path / "advice"
    assert main(["advise", "--trace", str(path), "--cluster", "paper-v100-nccl", "--world-size", "8",
                 "--compute-s", "0.01", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "trace:" in text and "recommended bucket cap" in text and "waits" in text and "gradient #" in text
    report = json.loads(out.with_name(out.name + ".json").read_text())
    figure = {f["figure"]: f for f in report["figures"]}
    assert main(["predict", "--trace", str(path), "--cluster", "paper-v100-nccl", "--world-size", "8",
                 "--compute-s", "0.01", "--json"]) == 0
    predicted = json.loads(capsys.readouterr().out)["predictions"][0]  # 25 MB, the same schedule
    assert figure["iteration at 8 ranks, 25 MB buckets"]["number"] * 1e3 == pytest.approx(predicted["latency_ms"])
    other = figure["other: data loading, your own work, earlier micro-batches (added as traced)"]["number"]
    assert other * 1e3 == pytest.approx(predicted["other_ms"]) and other > 0
    assert len(report["buckets"]) >= 1 and "buckets_registration_order" not in report  # a trace has no model order
    assert out.with_name(out.name + ".md").exists()


@pytest.mark.parametrize("argv, needle", [
    (["--batch-size", "4"], "--batch-size says what advise measures; with --trace nothing is measured"),
    (["--from-profile", "x.jsonl", "--iters", "3"], "--iters, --from-profile say what advise measures"),
    (["--world-size", "0"], "--world-size=0 is not allowed"),
])
def test_advise_from_a_trace_refuses_what_only_measuring_takes(cpu_trace, capsys, argv, needle):
    path, _ = cpu_trace
    assert main(["advise", "--trace", str(path), "--cluster", "paper-v100-nccl", *argv]) == 2
    assert needle in capsys.readouterr().err


def test_advise_needs_a_model_or_a_trace_and_refuses_a_trace_that_lacks_shapes(tmp_path, capsys):
    assert main(["advise", "--cluster", "paper-v100-nccl"]) == 2
    assert "--model is required (the model to profile), or --trace" in capsys.readouterr().err
    path = tmp_path / "noshapes.json"
    _trace(path, shapes=False)
    assert main(["advise", "--trace", str(path), "--cluster", "paper-v100-nccl"]) == 2
    err = capsys.readouterr().err
    assert "has no tensor shapes" in err and "record_shapes=True" in err
