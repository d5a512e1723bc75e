"""The argument checks the sub-commands share: each refuses a bad value before anything runs, with a
ConfigError naming the flag, the value and what is allowed (the CLI exits with status 2)."""
from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

from experiments.core.config import ConfigError, parse_ints, validate_network

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # as a shell reports a command that Ctrl-C ended


def add_network_arguments(parser) -> None:
    """`--link` and `--ranks-per-host` for the sub-commands that take them as plain options (allreduce, train)."""
    parser.add_argument("--link", default="none", metavar="LIST",
                        help="comma-separated: none (loopback, default) or link rates such as 500mbit,1gbit,10gbit: "
                             "ranks on emulated hosts behind links of that rate (needs root; see ddpbench network)")
    parser.add_argument("--ranks-per-host", default="1", metavar="LIST",
                        help="comma-separated: ranks per emulated host, placed in rank order (default 1)")


def items(value: str | list) -> list:
    """The values of a list option: its comma-separated text split, or the values themselves where given as
    data (the main job's plans)."""
    return [item.strip() for item in value.split(",")] if isinstance(value, str) else list(value)


def parse_network_arguments(link: str | list[str], ranks_per_host: str | list[int]) -> list[tuple[str, int]]:
    """The validated (link, ranks per host) pairs of `--link` x `--ranks-per-host`."""
    pairs = [(rate.lower(), k) for rate in items(link)
             for k in parse_ints("ranks-per-host", ranks_per_host, minimum=1)]
    for link, k in pairs:
        validate_network(link, k)
    return pairs


def check_output(path: Path, flag: str = "out") -> None:
    """Refuse an output file we could not append to, before anything runs (nothing is written)."""
    if path.exists():
        try:  # opening for appending writes nothing, and is the only answer root and /proc do not fool
            os.close(os.open(path, os.O_WRONLY | os.O_APPEND))
        except OSError as error:
            raise ConfigError(f"--{flag}={str(path)!r} is not a writable file ({error.strerror})") from None
        if path.is_dir():
            raise ConfigError(f"--{flag}={str(path)!r} is a folder, not a file")
        return
    _check_creatable(path, flag)


def check_folder(path: Path, flag: str) -> None:
    """Refuse an output folder we could not write files into, before anything runs (nothing is left behind)."""
    if path.exists():
        if not path.is_dir():
            raise ConfigError(f"--{flag}={str(path)!r} is not a folder")
        _try_writing_in(path, path, flag)
        return
    _check_creatable(path, flag)


def _check_creatable(path: Path, flag: str) -> None:
    ancestor = path.parent.absolute()
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ConfigError(f"--{flag}={str(path)!r}: cannot create it, {str(ancestor)!r} is a file")
    _try_writing_in(ancestor, path, flag)


def _try_writing_in(folder: Path, path: Path, flag: str) -> None:
    # Permission bits say nothing for root, and /proc or a read-only mount refuse only an actual
    # attempt: create a temporary file there, which is removed at once.
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        raise ConfigError(f"--{flag}={str(path)!r}: cannot create it under {str(folder)!r} "
                          f"({error.strerror or error})") from None


def check_positive(name: str, value: float) -> None:
    """Raise ConfigError unless `value` is a finite number > 0 (nan and inf reach clocks and sizes as errors
    deep inside a run, or as records that cannot be written)."""
    if not (value > 0 and math.isfinite(value)):
        raise ConfigError(f"--{name}={value} is not allowed; it must be a finite number > 0")


def check_at_least(name: str, value: float, minimum: float) -> None:
    """Raise ConfigError unless `value` is a finite number >= `minimum`."""
    if not (value >= minimum and math.isfinite(value)):
        raise ConfigError(f"--{name}={value} is not allowed; it must be a finite number >= {minimum:g}")


# The most seconds a timeout may be: the ranks turn it into timedeltas and C++ durations, which overflow
# somewhere past 1e13 s; a year is as good as no limit.
MAX_TIMEOUT_S = 365 * 24 * 3600


def check_timeout(name: str, value: float) -> None:
    """Raise ConfigError unless `value` is a number of seconds > 0 and at most MAX_TIMEOUT_S (a year)."""
    if not 0 < value <= MAX_TIMEOUT_S:
        raise ConfigError(f"--{name}={value} is not allowed; it must be > 0 and at most {MAX_TIMEOUT_S} seconds "
                          "(a year)")
