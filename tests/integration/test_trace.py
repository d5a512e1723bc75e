"""`predict --trace` / `tune-bucket --trace`: a torch.profiler trace of the user's own loop read as a profile."""

from experiments.cli import main
from experiments.perfmodel.trace import read_trace


def test_the_example_loop_writes_a_trace_that_predicts(tmp_path, capsys):
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "example.json"
    root = Path(__file__).resolve().parents[2]
    example = subprocess.run([sys.executable, str(root / "examples" / "trace_my_loop.py"), "--model",
                              str(root / "examples" / "my_model.py"), "--image-size", "8", "--batch-size", "2",
                              "--steps", "5", "--clip", "1.0", "--accumulate", "2", "--out", str(out)],
                             check=True, capture_output=True, text=True)
    # Kineto's "gpuGetDeviceCount failed with code 35" of a CUDA build on a machine without a GPU is not shown
    assert "gpuGetDeviceCount" not in example.stderr, example.stderr
    trace = read_trace(out)
    assert len(trace.steps) == 3 and trace.accumulate > 0 and trace.profile.tail > 0  # clipping after backward
    assert main(["predict", "--trace", str(out), "--cluster", "paper-v100-nccl"]) == 0
    assert "waits for gradient #" in capsys.readouterr().out
