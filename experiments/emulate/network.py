"""An emulated cluster on one machine: each host a network namespace, joined by rate-limited links.

The launcher asks for one `EmulatedCluster` per pool of ranks and closes it afterwards; ranks only
learn which namespace to enter and which interface to use (`Placement`). Nothing else in the suite
knows about namespaces.

Topology, all of it inside namespaces this run creates (the machine's own interfaces and routes are
never touched):

    host namespace  <name>-h<i>:  lo (ranks of one host talk over it, unshaped, as GPUs over NVLink)
                                  eth0, 198.18.0.<i+1>/24, MTU 9000, egress shaped at the link rate
          | veth pair
    switch namespace <name>-sw:   h<i> (egress to host i shaped at the link rate), enslaved to br0,
                                  br0 198.18.0.254/24: the switch, and where the rendezvous store listens

198.18.0.0/15 is the range set aside for benchmarking network devices (RFC 2544), so no real network
is ever addressed. Each direction of each host's link has its own token bucket (tc tbf), so a host
sends and receives at the rate at once, as over a full-duplex NIC. Namespace names carry the creating
process's id and a random part: two runs never collide, and `cleanup()` can tell a dead run's
namespaces (its process is gone) from a live one's.

Removal cannot be cut short: SIGINT and SIGTERM wait while a cluster is removed (three Ctrl-C in a
row once left namespaces behind), and a cluster still open when the interpreter exits is removed then.
"""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import re
import secrets
import shutil
import signal
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from experiments.core.config import parse_rate
from experiments.core.git import prune_worktrees

PREFIX = "ddpbench-"
CHECKOUT = Path(__file__).resolve().parents[2]  # whose worktrees `--cleanup` prunes (ab's default --repo)
NETNS_DIR = Path("/run/netns")
SUBNET = "198.18.0"
SWITCH_ADDRESS = f"{SUBNET}.254"
HOST_INTERFACE = "eth0"
MTU = 9000  # jumbo frames, as on cluster networks: TCP then carries 99% of the link rate, not 95%
QUEUE_LATENCY = "20ms"  # how long a packet may wait in a shaper's queue before it is dropped
MAX_HOSTS = 250
_CLONE_NEWNET = 0x40000000
_CAP_NET_ADMIN, _CAP_SYS_ADMIN = 12, 21
_HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_OPEN: set["EmulatedCluster"] = set()  # clusters of this process not yet removed (see _close_open_clusters)


def dilated(link: str, factor: float) -> str:
    """The rate to shape a link at when time runs `factor` times slower (`100gbit`, 200 -> `500mbit`)."""
    if link == "none" or factor == 1:
        return link
    return f"{parse_rate(link) / factor / 1e3:.3f}".rstrip("0").rstrip(".") + "kbit"


def burst_bytes(rate_bps: float) -> int:
    """The token bucket's size: 1 ms at the rate, but at least two 64 KiB segments (veth sends TCP in
    segments of up to 64 KiB, and a bucket smaller than one would split them)."""
    return max(int(rate_bps / 8 * 1e-3), 128 * 1024)


@dataclass(frozen=True)
class Placement:
    """Where one rank runs: the namespace it enters and the interface its collectives use."""

    netns: str
    interface: str


def hosts_needed(world_size: int, ranks_per_host: int) -> int:
    """Ranks go `ranks_per_host` to a host, in rank order; the last host may hold fewer."""
    return -(-world_size // ranks_per_host)


def qdisc(link: str) -> str:
    """The tc qdisc installed on each direction of each host's link at rate `link`."""
    return f"tbf rate {link} burst {burst_bytes(parse_rate(link))} latency {QUEUE_LATENCY}"


def describe(link: str, hosts: int) -> dict:
    """What a record keeps of the emulated network it was measured on (its `env.network`)."""
    return {"link": link, "rate_bps": parse_rate(link), "hosts": hosts, "qdisc": qdisc(link),
            "shaped": "each host's link, both directions", "mtu": MTU, "intra_host": "loopback, unshaped"}


class EmulatedCluster:
    """`hosts` network namespaces behind one switch, each host's link shaped at `link` in both directions.

    Use as a context manager, or call `create()` and `close()`; `close()` removes everything, and is
    safe to call twice or after a partial `create()`.
    """

    def __init__(self, hosts: int, link: str):
        if not 1 <= hosts <= MAX_HOSTS:
            raise ValueError(f"hosts must be 1..{MAX_HOSTS}, got {hosts!r}")
        self.hosts, self.link, self.rate_bps = hosts, link, parse_rate(link)
        self.name = f"{PREFIX}{os.getpid()}-{secrets.token_hex(3)}"
        self.switch = f"{self.name}-sw"
        self.created: list[str] = []
        self._open = False

    def host_netns(self, host: int) -> str:
        """The namespace of host `host`."""
        return f"{self.name}-h{host}"

    def placement(self, rank: int, ranks_per_host: int) -> Placement:
        """Where rank `rank` runs when ranks go `ranks_per_host` to a host."""
        return Placement(self.host_netns(rank // ranks_per_host), HOST_INTERFACE)


    def create(self) -> "EmulatedCluster":
        """Make the namespaces, the switch and the shaped links; on any failure remove what was made."""
        self._open = True
        _OPEN.add(self)
        try:
            self._add_netns(self.switch)
            _ip(self.switch, "link", "add", "br0", "type", "bridge")
            _ip(self.switch, "addr", "add", f"{SWITCH_ADDRESS}/24", "dev", "br0")
            _ip(self.switch, "link", "set", "br0", "up")
            _ip(self.switch, "link", "set", "lo", "up")  # the store's own client connects to it over lo
            for host in range(self.hosts):
                netns, port = self.host_netns(host), f"h{host}"
                self._add_netns(netns)
                # Created inside the two namespaces directly: no interface ever appears in the machine's own.
                _ip(self.switch, "link", "add", port, "mtu", str(MTU), "type", "veth", "peer", "name", HOST_INTERFACE,
                    "mtu", str(MTU), "netns", netns)
                _ip(self.switch, "link", "set", port, "master", "br0", "up")
                # IPv6 off: Gloo would otherwise find a tentative link-local address on eth0 first.
                _run(["ip", "netns", "exec", netns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"])
                _ip(netns, "addr", "add", f"{SUBNET}.{host + 1}/24", "dev", HOST_INTERFACE)
                _ip(netns, "link", "set", HOST_INTERFACE, "up")
                _ip(netns, "link", "set", "lo", "up")
                for where, dev in ((netns, HOST_INTERFACE), (self.switch, port)):  # host's upload, download
                    _run(["tc", "-n", where, "qdisc", "add", "dev", dev, "root", *qdisc(self.link).split()])
        except BaseException:
            self.close()
            raise
        return self

    def run_in_switch(self, fn: Callable[[], Any]) -> Any:
        """Call `fn` on a thread that has entered the switch namespace; sockets it opens stay there.

        The calling thread never changes namespace (a namespace belongs to a thread, not a process).
        """
        result: dict[str, Any] = {}

        def target() -> None:
            try:
                enter_netns(self.switch)
                result["value"] = fn()
            except BaseException as error:  # noqa: BLE001 - re-raised in the caller
                result["error"] = error

        thread = threading.Thread(target=target, name="ddpbench-switch")
        thread.start()
        thread.join()
        if "error" in result:
            raise result["error"]
        return result["value"]

    def close(self, replay_signals: bool = True) -> None:
        """Remove every namespace this cluster made (their interfaces and qdiscs go with them).

        Ctrl-C and SIGTERM wait until it is done (see `signals_held`); safe to call again.
        """
        if not self._open:
            return
        with signals_held(replay=replay_signals):
            # The names recorded, and any other of this cluster's (an `ip netns add` cut short after it made
            # one); a second pass for a removal that did not take.
            for _ in range(2):
                for netns in dict.fromkeys([*reversed(self.created), *list_netns(f"{self.name}-")]):
                    _remove_netns(netns)
                if not list_netns(f"{self.name}-"):
                    break
            self.created.clear()
            self._open = False
            _OPEN.discard(self)

    def _add_netns(self, netns: str) -> None:
        self.created.append(netns)  # first: an interruption during `ip netns add` must not hide the name
        _run(["ip", "netns", "add", netns])

    def __enter__(self) -> "EmulatedCluster":
        return self.create()

    def __exit__(self, *exc) -> None:
        self.close()


@contextlib.contextmanager
def signals_held(replay: bool = True):
    """Hold SIGINT and SIGTERM off while the block runs (a clean-up that must finish), then deliver them.

    Each signal that arrived meanwhile is raised again once afterwards (with `replay`), so Ctrl-C still
    interrupts, only after the clean-up. The signals are also blocked in this thread, so that the
    commands it starts (`ip`) inherit the block and outlive a Ctrl-C sent to the whole process group.
    Outside the main thread (where Python cannot set handlers) it holds nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous: dict[int, Any] = {}
    late: BaseException | None = None  # an interruption already on its way when the hold began
    for signum in _HELD_SIGNALS:
        while signum not in previous:
            try:
                previous[signum] = signal.signal(signum, lambda number, frame: caught.append(number))
            except KeyboardInterrupt as error:  # raised by the old handler before the new one took over
                late = error
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # signals pending on this thread reach the handler above
        for signum, handler in previous.items():
            if handler is not None:  # None: a handler not set from Python, which cannot be put back
                signal.signal(signum, handler)
        if replay:
            for signum in dict.fromkeys(caught):
                signal.raise_signal(signum)
            if late is not None:
                raise late


@atexit.register
def _close_open_clusters() -> None:
    """At exit, remove the clusters still open (an interruption between making one and taking charge of it)."""
    for cluster in list(_OPEN):
        cluster.close(replay_signals=False)


def enter_netns(netns: str) -> None:
    """Move the calling thread into namespace `netns`; threads it starts afterwards follow it."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    fd = os.open(NETNS_DIR / netns, os.O_RDONLY)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"setns into network namespace {netns}: {os.strerror(errno)}")
    finally:
        os.close(fd)


def enter_host(placement: Placement) -> None:
    """In a rank's process, before any socket: join its host and bind collectives to the host's interface.

    NCCL (on GPU machines) is told the interface and a host id per emulated host, so that ranks on
    different emulated hosts use sockets over the shaped link, while ranks of one host keep shared
    memory and P2P, as GPUs inside a server do.
    """
    enter_netns(placement.netns)
    os.environ["GLOO_SOCKET_IFNAME"] = placement.interface
    os.environ["NCCL_SOCKET_IFNAME"] = placement.interface
    os.environ["NCCL_HOSTID"] = placement.netns
    os.environ["NCCL_IB_DISABLE"] = "1"


def check() -> list[str]:
    """What this machine lacks to emulate a cluster (empty when it can): privileges, tools, kernel support.

    Beyond looking, it builds and removes a one-host cluster, which is the only proof that the kernel
    has namespaces, veth, bridges and the tbf qdisc.
    """
    problems = []
    caps = _effective_capabilities()
    for bit, name in ((_CAP_NET_ADMIN, "CAP_NET_ADMIN"), (_CAP_SYS_ADMIN, "CAP_SYS_ADMIN")):
        if not caps >> bit & 1:
            problems.append(f"{name} is missing (run as root)")
    for tool, package in (("ip", "iproute2"), ("tc", "iproute2")):
        if shutil.which(tool) is None:
            problems.append(f"`{tool}` is not on PATH (install {package})")
    if problems:
        return problems
    try:
        with EmulatedCluster(1, "100mbit"):
            pass
    except (OSError, subprocess.CalledProcessError) as error:
        problems.append(f"cannot build a test cluster: {_error_text(error)}")
    return problems


def list_netns(prefix: str = PREFIX) -> list[str]:
    """Network namespaces whose names start with `prefix` (ddpbench's own, by default)."""
    if not NETNS_DIR.is_dir():
        return []
    return sorted(p.name for p in NETNS_DIR.iterdir() if p.name.startswith(prefix))


def cleanup() -> tuple[list[str], list[str]]:
    """Remove the namespaces of ddpbench runs whose process is gone (killed by SIGKILL, say).

    Returns (removed, kept): those of runs still alive are kept.
    """
    removed, kept = [], []
    for netns in list_netns():
        match = re.match(rf"{PREFIX}(\d+)-", netns)
        if match and Path(f"/proc/{match.group(1)}").exists():
            kept.append(netns)
            continue
        _remove_netns(netns)
        removed.append(netns)
    return removed, kept


def _effective_capabilities() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def _ip(netns: str, *args: str) -> None:
    _run(["ip", "-n", netns, *args])


def _run(argv: list[str]) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True, timeout=30)


def _remove_netns(netns: str) -> None:
    subprocess.run(["ip", "netns", "del", netns], capture_output=True, timeout=30)


def _error_text(error: BaseException) -> str:
    if isinstance(error, subprocess.CalledProcessError):
        return f"`{' '.join(error.cmd)}` failed: {(error.stderr or '').strip() or error.returncode}"
    return str(error)


def add_arguments(parser) -> None:
    """The `network` sub-command's options."""
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--check", action="store_true",
                      help="say whether this machine can emulate a cluster (--link); exit 0 only if it can")
    what.add_argument("--cleanup", action="store_true",
                      help="remove the namespaces (and the git worktrees of ab, history, drill in this checkout) that "
                           "killed ddpbench runs left behind")


@dataclass(frozen=True)
class NetworkOptions:
    """`ddpbench network`'s one choice (its flags, typed): --check, else --cleanup."""

    check: bool = False
    cleanup: bool = False


def main(options: NetworkOptions) -> int:
    """`ddpbench network --check | --cleanup`."""
    if options.check:
        problems = check()
        if problems:
            print("ddpbench network: this machine cannot emulate a cluster (--link); --link none works without it:")
            for problem in problems:
                print(f"  - {problem}")
            return 1
        print("ddpbench network: this machine can emulate a cluster (namespaces, veth, bridge, tc tbf): --link works")
        return 0
    removed, kept = cleanup()
    for netns in removed:
        print(f"removed {netns}")
    for netns in kept:
        print(f"kept {netns} (its ddpbench run is still running)")
    trees = prune_worktrees(CHECKOUT)
    for tree in trees:
        print(f"removed the worktree {tree}")
    print(f"ddpbench network: {len(removed)} namespace(s) removed, {len(kept)} of running runs kept; "
          f"{len(trees)} stale worktree(s) removed")
    return 0
