"""`scale-profile --trace`: a trace of the user's loop as a profile record that the scale model replays."""
import json

import pytest
import torch

from experiments.cli import main
from experiments.core.config import ConfigError
from experiments.core.records import read_records
from experiments.perfmodel.trace import read_trace
from experiments.perfmodel.trace_record import match_parameters
from tests.unit.test_trace import _trace

# The traced loop's model (tests/unit/test_trace.py's _model) as a workload file `run --model` builds.
WORKLOAD = '''
import torch
from torch import nn


def build_model(hidden: int = 32):
    return nn.Sequential(nn.Linear(16, hidden), nn.BatchNorm1d(hidden), nn.ReLU(), nn.Linear(hidden, 4))


def make_batch(model, batch_size, image_size, seq_len, generator):
    return {"x": torch.randn(batch_size, 16, generator=generator),
            "y": torch.randint(0, 4, (batch_size,), generator=generator)}


def loss(model, batch):
    return nn.functional.cross_entropy(model(batch["x"]), batch["y"])
'''


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """A real CPU trace of the loop, the workload file of its model, and the profile read from the trace."""
    folder = tmp_path_factory.mktemp("traced")
    trace, workload, profile = folder / "loop.json", folder / "mine.py", folder / "profile.jsonl"
    _trace(trace)
    workload.write_text(WORKLOAD)
    assert main(["scale-profile", "--trace", str(trace), "--model", str(workload), "--batch-size", "8",
                 "--out", str(profile)]) == 0
    return trace, workload, profile


def test_each_parameter_gets_the_ready_time_of_its_traced_gradient(traced):
    trace_path, workload, profile = traced
    record, = read_records(profile)
    trace = read_trace(trace_path)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 4))
    assert record["kind"] == "profile" and record["source"] == "trace" and record["config"]["model"] == str(workload)
    assert record["bytes"] == [p.numel() * 4 for p in model.parameters()]  # the model's order, not arrival
    assert len(record["synced"]) == len(trace.steps) == 3
    # a parameter of a shape of its own gets its gradient's ready time as traced; the three of shape [32]
    # (the first linear's bias, the norm's weight and bias) share theirs among them
    shapes = [tuple(p.shape) for p in model.parameters()]
    for row, traced_row in zip(record["synced"], trace.iterations):
        for shape in set(shapes):
            mine = sorted(row["ready"][i] for i, s in enumerate(shapes) if s == shape)
            assert mine == sorted(traced_row["ready"][g.index] for g in trace.gradients if g.shape == shape)
            if shapes.count(shape) == 1:
                assert row["ready"][shapes.index(shape)] == traced_row["ready"][
                    next(g.index for g in trace.gradients if g.shape == shape)]
        assert row["backward"] == traced_row["backward"] and row["forward"] == traced_row["forward"]
    # the output layer's gradients arrive first, the input layer's last
    assert max(record["synced"][0]["ready"][:2]) > max(record["synced"][0]["ready"][-2:])


def test_a_trace_of_another_model_is_refused_naming_the_gradient(traced, tmp_path, capsys):
    trace_path, workload, _ = traced
    assert main(["scale-profile", "--trace", str(trace_path), "--model", str(workload), "--model-config", "hidden=8",
                 "--out", str(tmp_path / "p.jsonl")]) == 2
    error = capsys.readouterr().err
    assert "traced gradient #" in error and "matches no parameter" in error and "--model-config" in error
    assert not (tmp_path / "p.jsonl").exists()


def test_parameters_of_one_shape_are_matched_from_the_last_backwards():
    parameters = [("a.weight", (4, 4), "torch.float32"), ("a.bias", (4,), "torch.float32"),
                  ("b.weight", (4, 4), "torch.float32"), ("b.bias", (4,), "torch.float32")]
    arrivals = [((4,), "torch.float32"), ((4, 4), "torch.float32"), ((4,), "torch.float32"), ((4, 4), "torch.float32")]
    assert match_parameters(arrivals, parameters) == [3, 2, 1, 0]
    with pytest.raises(ConfigError, match="the trace has 3 gradients, the model 4"):
        match_parameters(arrivals[:3], parameters)
    with pytest.raises(ConfigError, match=r"traced gradient #1 \[4, 4\] torch.float16"):
        match_parameters([arrivals[0], ((4, 4), "torch.float16")] + arrivals[2:], parameters)


def test_scale_profile_needs_a_gpu_with_a_profile_and_one_model_with_a_trace(traced, tmp_path, capsys):
    trace_path, workload, profile = traced
    assert main(["scale-profile", "--profile", str(profile), "--model", str(workload),
                 "--out", str(tmp_path / "p.jsonl")]) == 2
    assert "--gpu is required with --profile" in capsys.readouterr().err
    assert main(["scale-profile", "--trace", str(trace_path), "--model", f"{workload},resnet50",
                 "--out", str(tmp_path / "p.jsonl")]) == 2
    assert "name the one model the trace is of" in capsys.readouterr().err
    assert json.loads(profile.read_text().splitlines()[0])["trace"]["steps"]
