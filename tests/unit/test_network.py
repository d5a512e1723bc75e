"""The emulated cluster: links deliver their rate, nothing is left behind, and a machine that cannot
emulate is refused up front. Runs as root (as CI does); low rates and small messages keep it fast."""
import os
import subprocess

import pytest

from experiments.cli import main
from experiments.emulate import network
from tests.unit.test_runner import TINY

PROBLEMS = network.check()
pytestmark = pytest.mark.skipif(bool(PROBLEMS), reason=f"this machine cannot emulate a cluster: {PROBLEMS}")


def test_rates_parse_in_tc_units_and_bursts_fit_the_rate():
    assert network.parse_rate("500mbit") == 500e6 and network.parse_rate("2.5GBIT") == 2.5e9
    for bad in ("fast", "1tbit", "0gbit", "-1gbit", "1 gbit/s"):
        with pytest.raises(ValueError, match="is not a link rate"):
            network.parse_rate(bad)
    assert network.burst_bytes(100e6) == 128 * 1024  # never below two 64 KiB segments
    assert network.burst_bytes(10e9) == 1_250_000  # 1 ms at the rate
    assert network.hosts_needed(5, 2) == 3


@pytest.mark.parametrize("missing", ["tc", "privileges"])
def test_a_machine_that_cannot_emulate_is_refused_before_anything_runs(tmp_path, capsys, monkeypatch, missing):
    if missing == "tc":
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        os.symlink(subprocess.run(["which", "ip"], capture_output=True, text=True).stdout.strip(), bin_dir / "ip")
        monkeypatch.setenv("PATH", str(bin_dir))
        needle = "`tc` is not on PATH (install iproute2)"
    else:
        monkeypatch.setattr(network, "_effective_capabilities", lambda: 0)
        needle = "CAP_NET_ADMIN is missing (run as root)"
    out = tmp_path / "r.jsonl"
    assert main(["run", *TINY, "--link", "1gbit", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert needle in err and "--link none (loopback) works without it" in err
    assert not out.exists()
    assert main(["network", "--check"]) == 1
    assert needle in capsys.readouterr().out


def test_more_ranks_per_host_than_ranks_is_refused(tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    assert main(["run", *TINY, "--link", "1gbit", "--world-size", "2", "--ranks-per-host", "3", "--out", str(out)]) == 2
    assert "--ranks-per-host=3 is more than --world-size=2" in capsys.readouterr().err
    assert main(["allreduce", "--link", "1gbit", "--ranks-per-host", "3", "--out", str(out)]) == 2
    assert not out.exists()
