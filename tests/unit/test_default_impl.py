"""`run` measures PyTorch's DDP unless told otherwise; the paper's experiments and the gate name ddp_core."""
import pytest

from experiments.cli import build_parser
from experiments.core.config import RunConfig
from experiments.measure import plans
from experiments.measure.configs import resolve_grid
from experiments.perfmodel.report import format_markdown, format_terminal
from experiments.regression.ab import PRESETS


def test_run_measures_pytorchs_ddp_by_default():
    assert RunConfig().impl == "torch"
    help_text = build_parser()._subparsers._group_actions[0].choices["run"].format_help()
    assert "default 'torch'" in help_text and "PyTorch's" in help_text


@pytest.mark.parametrize("profile", ["smoke", "quick", "full"])
@pytest.mark.parametrize("gpus", [0, 2])
def test_the_paper_experiments_name_ddp_core(profile, gpus, tmp_path):
    """Every `run` step of the main job rebuilds the paper's system: each names its impl, none falls back to
    the default (which is PyTorch's DDP)."""
    steps = plans.plan(profile, gpus, tmp_path)
    runs = {name: step for name, step in steps.items() if step.command == "run"}
    assert runs
    for name, step in runs.items():
        impls = step.options.get("impl")
        assert impls, f"{name} does not name its impl"
        assert set(impls) <= {"ddp_core", "ddp_core_no_overlap"}, (name, impls)


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_the_gate_measures_ddp_core(preset):
    """An A/B of two revisions compares this project's DDP: PyTorch's is the same in both trees."""
    assert {c.impl for c in resolve_grid(PRESETS[preset]["grid"])} == {"ddp_core"}


def test_advise_says_whose_options_it_advises_on():
    report = {"model": "m", "model_config": "", "amp": "none", "network": "loopback", "network_source": "fit",
              "profile": "profile: x", "warnings": [], "figures": [{"figure": "f", "kind": "measured", "value": "1"}]}
    for text in (format_terminal(report), format_markdown(report)):
        assert "PyTorch's DistributedDataParallel" in text and "the probes measure them with ddp_core" in text
