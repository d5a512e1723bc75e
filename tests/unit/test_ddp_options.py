"""DDP's own options as grid parameters of `run`, for ddp_core and PyTorch's DDP alike: parsed as lists,
refused up front where an implementation cannot run them, recorded in the config, and handed to DDP."""

from experiments.cli import main
from experiments.core.config import RunConfig
from experiments.core.records import config_key
from experiments.measure.configs import expand_grid


def test_options_are_lists_and_a_bad_value_is_refused(tmp_path, capsys):
    configs = expand_grid({"static_graph": [False, True], "bucket_view": [True], "world_size": [1]})
    assert [(c.static_graph, c.bucket_view) for c in configs] == [(False, True), (True, True)]
    # PowerSGD's rank is one config per rank only where the hook is PowerSGD
    configs = expand_grid({"comm_hook": ["none", "powersgd"], "powersgd_rank": [1, 4], "world_size": [1]})
    assert sorted((c.comm_hook, c.powersgd_rank) for c in configs) == [("none", 1), ("powersgd", 1), ("powersgd", 4)]
    out = tmp_path / "r.jsonl"
    for argv, needle in ((["--static-graph", "maybe"], "--static-graph: 'maybe' is not a valid boolean (true or false)"),
                         (["--compile", "fast"], "--compile='fast' is not allowed; choose one of none, default"),
                         (["--impl", "ddp_core", "--comm-hook", "powersgd", "--process-groups", "2"], "PowerSGD's state holds one process"),
                         (["--powersgd-rank", "0", "--comm-hook", "powersgd"], "--powersgd-rank=0 is not allowed")):
        assert main(["run", *argv, "--out", str(out)]) == 2
        assert needle in capsys.readouterr().err
    assert not out.exists()


def test_records_made_before_the_options_still_match_todays_configs():
    config = RunConfig().__dict__
    old = {k: v for k, v in config.items() if k not in ("find_unused_parameters", "static_graph", "bucket_view",
                                                        "compile", "powersgd_rank")}
    assert config_key(old) == config_key(config)
