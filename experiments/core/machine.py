"""The machine a measurement runs on: its identity (a fingerprint and a name the user can change, as
`asv machine` keeps one), its environment (stored in every record), how busy its cores are, and whether
ranks run under torchrun. Results are keyed by the machine's name and are only ever read as that
machine's; the project's own results live apart, under results/reference/."""
from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import re
import resource
import socket
import time
from pathlib import Path

from experiments.core.config import ConfigError
from experiments.core.git import git_or_empty
from experiments.core.procfs import process_stat


def under_torchrun() -> bool:
    """Whether this process is a rank started by torchrun (or another launcher that sets RANK/WORLD_SIZE)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def busy_cpu_seconds() -> float | None:
    """CPU seconds the whole machine has spent busy so far (/proc/stat: all but idle and iowait), or
    None where /proc/stat is missing."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return None
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def descendants_cpu_seconds() -> float:
    """CPU seconds used so far by this process's descendants: those that ended and were waited for
    (getrusage), and those alive or not yet waited for (/proc, with what they waited for in turn).
    Ranks are grandchildren, forked by multiprocessing's fork server (experiments.measure.launch)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = children.ru_utime + children.ru_stime
    kids: dict[int, list[tuple[int, list[str]]]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if entry.isdigit() and (fields := process_stat(int(entry))) is not None:
            kids.setdefault(int(fields[1]), []).append((int(entry), fields))
    ticks, todo = 0, [os.getpid()]
    while todo:
        for pid, fields in kids.get(todo.pop(), []):
            ticks += sum(int(x) for x in fields[11:15])  # utime, stime, cutime, cstime
            todo.append(pid)
    return total + ticks / os.sysconf("SC_CLK_TCK")


def cpu_seconds() -> tuple[float, float] | None:
    """CPU seconds used so far by every process on the machine (/proc/stat) and by this process's
    descendants; None where /proc/stat is missing."""
    busy = busy_cpu_seconds()
    if busy is None:
        return None
    return busy, descendants_cpu_seconds()


def other_cores_busy(before: tuple[float, float] | None, after: tuple[float, float] | None,
                     wall: float) -> float | None:
    """The cores that processes other than this one's descendants kept busy on average between two
    cpu_seconds() readings `wall` seconds apart; None where /proc/stat is missing."""
    if before is None or after is None:
        return None
    return max(0.0, (after[0] - before[0]) - (after[1] - before[1])) / wall


def environment(threads: int | None = None) -> dict:
    """Where and with what a record was measured: commit, versions, host, CPU, GPU, threads, time."""
    import torch

    def git(*args: str) -> str:
        return git_or_empty(*args, cwd=Path(__file__).resolve().parent)

    cuda = torch.cuda.is_available()
    nccl = torch.cuda.nccl.version() if cuda else None
    return {
        "git_commit": git("rev-parse", "HEAD") or None,
        "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl,
        "python": platform.python_version(),
        "host": socket.gethostname(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "gpu_count": torch.cuda.device_count() if cuda else 0,
        "machine": machine_name(),  # the name and identity of the machine (see this_machine)
        "machine_id": this_machine()["id"],
        "threads_per_rank": threads,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


# A machine's name: what results are filed under (results/runs/<name>/). Letters, digits, '.', '_', '-'.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
RESERVED_NAMES = ("reference",)  # results/reference/ holds the project's committed results


def machine_file() -> Path:
    """Where this user's machines are named: $DDPBENCH_MACHINE_FILE, else ~/.config/ddpbench/machine.json."""
    if os.environ.get("DDPBENCH_MACHINE_FILE"):
        return Path(os.environ["DDPBENCH_MACHINE_FILE"])
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "ddpbench" / "machine.json"


def host_id() -> str:
    """A stable, anonymous id of this host: a hash of /etc/machine-id (systemd's), else of the host name."""
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text:
            return hashlib.sha256(text.encode()).hexdigest()[:12]
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:12]


@functools.lru_cache(maxsize=1)
def host_key() -> str:
    """Which host this process runs on, to tell the ranks of one host (sharing its cores) from others':
    its name and id together (cloned machines may share an id, containers of one host a name)."""
    return f"{socket.gethostname()}/{host_id()}"


QUIET_CORES = 0.2  # cores other processes may keep busy before a measurement is called not quiet (run, ab)


def fingerprint() -> dict:
    """What makes two machines measure alike or not: CPU model, cores, memory, GPU model and count, and
    the host they are (two hosts of the same kind still differ: other tenants, other cooling)."""
    import torch

    cuda = torch.cuda.is_available()
    return {"arch": platform.machine(), "cpu": _cpu_model(), "cores": os.cpu_count(),
            "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30),
            "gpu": torch.cuda.get_device_name(0) if cuda else None,
            "gpu_count": torch.cuda.device_count() if cuda else 0, "host_id": host_id()}


def fingerprint_id(print_: dict) -> str:
    """A short hash of a fingerprint: the machine's identity in records."""
    return hashlib.sha256(json.dumps(print_, sort_keys=True).encode()).hexdigest()[:10]


def default_name(print_: dict) -> str:
    """A readable name for a fingerprint: arch, cores, GPUs, and 6 digits of its id (so that two
    machines of the same kind get different names)."""
    name = f"{print_['arch']}-{print_['cores']}cpu"
    if print_["gpu_count"]:
        name += f"-{print_['gpu_count']}x{print_['gpu'].replace('NVIDIA ', '').replace(' ', '_')}"
    return f"{name}-{fingerprint_id(print_)[:6]}"


def _read_machines(path: Path) -> dict:
    try:
        known = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as error:
        raise ConfigError(f"machine file {path} cannot be read ({error}); fix or remove it") from None
    if not isinstance(known, dict) or not isinstance(known.get("machines", {}), dict):
        raise ConfigError(f"machine file {path} is not a ddpbench machine file; fix or remove it")
    return known.get("machines", {})


def _write_machines(path: Path, machines: dict) -> None:
    # Written whole to a temporary file and renamed: a crash never leaves half a machine file.
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + f".{os.getpid()}.tmp")
    temporary.write_text(json.dumps({"version": 1, "machines": machines}, indent=1, sort_keys=True) + "\n")
    os.replace(temporary, path)


@functools.lru_cache(maxsize=1)
def this_machine() -> dict:
    """This machine: {name, id, fingerprint}. Named once, in the machine file (a default name the first
    time, written there); a machine whose fingerprint changed (another host, more memory, a GPU) is a
    new machine with a name of its own, so that its results are never read as the old one's."""
    print_ = fingerprint()
    ident = fingerprint_id(print_)
    path = machine_file()
    machines = _read_machines(path)
    if ident not in machines:
        machines[ident] = {"name": default_name(print_), "fingerprint": print_}
        try:
            _write_machines(path, machines)
        except OSError:
            pass  # a read-only home: the default name still keys the results, it is just not kept
    return {"name": machines[ident]["name"], "id": ident, "fingerprint": print_}


def machine_name() -> str:
    """This machine's name, which keys its stored results (results/runs/<name>/); see this_machine."""
    return this_machine()["name"]


def runs_folder(name: str | None = None) -> Path:
    """Where a machine's records are filed (this machine's by default): $DDPBENCH_RESULTS (default the
    project's results/)/runs/<machine>/."""
    results = os.environ.get("DDPBENCH_RESULTS") or Path(__file__).resolve().parents[2] / "results"
    return Path(results) / "runs" / (name or machine_name())


def rename_machine(name: str) -> dict:
    """Name this machine `name` in the machine file; ConfigError for a name that is not allowed or that
    another machine already has (its results would be mixed with this one's)."""
    if not NAME_PATTERN.fullmatch(name) or name.lower() in RESERVED_NAMES:
        raise ConfigError(f"--machine={name!r} is not allowed; a name is 1-64 letters, digits, '.', '_' or '-' "
                          f"(starting with a letter or digit), and not {', '.join(RESERVED_NAMES)}")
    current = this_machine()
    path = machine_file()
    machines = _read_machines(path)
    taken = [i for i, m in machines.items() if m.get("name") == name and i != current["id"]]
    if taken:
        raise ConfigError(f"--machine={name!r} already names another machine in {path} (id {taken[0]}); "
                          "choose another name")
    machines[current["id"]] = {"name": name, "fingerprint": current["fingerprint"]}
    try:
        _write_machines(path, machines)
    except OSError as error:
        raise ConfigError(f"--machine={name!r}: cannot write {path} ({error.strerror or error})") from None
    this_machine.cache_clear()
    return this_machine()


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
