"""Timeouts taken from the same run: how long a set of ranks takes to start on this machine, now.

A config's timeout also covers its ranks' start-up (forking them, the run's first set also importing
torch once; joining the process group), which takes seconds on a quiet machine and several times that
beside other work. A test whose timeout must let a config finish, yet end a hanging one soon, scales it
from a start-up measured just before, under the same load.
"""
import time

from experiments.measure.launch import RankPool


def _nothing(rank: int, world_size: int) -> None:
    return None


def rank_start_up_s(world_size: int = 2, link: str = "none") -> float:
    """Seconds from starting `world_size` ranks (over `link`) until all have answered a first task."""
    started = time.monotonic()
    with RankPool(world_size, link=link, timeout=600) as pool:
        pool.run(_nothing, timeout=600)
    return time.monotonic() - started


def timeout_after_start_up(start_up_s: float, at_least: float = 15.0) -> float:
    """A config timeout that a config of tiny work starting fresh ranks meets even when start-up takes
    three times as long as the one just measured; `at_least` keeps a quiet machine's at its usual size."""
    return max(at_least, 3 * start_up_s)
