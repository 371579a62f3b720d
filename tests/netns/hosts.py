"""Hosts in network namespaces for the fault tests: real processes on separate network stacks.

A :class:`Network` is the test's own private /24 (picked from the RFC 2544 benchmarking range
``198.18.0.0/15`` among the /24s no route of this machine already covers): a Linux bridge in the
root namespace holds ``.1`` (so the test itself reaches every host), and each :class:`Host` is a
network namespace (``ip netns add``) joined to the bridge by a veth pair, with one address in
the /24 and no default route. Nothing in a namespace can reach any address outside the /24, and
the root namespace gains only the bridge's route to it.

Words:

- *host*: one namespace with its ``eth0`` (the veth end inside it), its loopback and an address.
- *cut* / *heal*: take the host off the network and put it back, in one of two ways
  (:data:`CUTS`): ``down``, ``ip link set eth0 down`` inside the host (its route goes with the
  link: new connections fail at once, established ones time out); ``unplug``, its veth end
  taken off the bridge (its link stays up and every packet is silently lost: connections time
  out, as in a real partition).

Only network namespaces are made: PIDs, files and users are shared with the test, so the test
counts a host's processes by the network namespace each one is in (``/proc/PID/ns/net``).

Everything is torn down by :meth:`Network.close` (every process left in a namespace SIGKILLed,
the namespaces and the bridge deleted), also on failure; a run killed before it could clean up
is swept by the next one (names carry the creating PID).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

#: Every namespace and bridge these tests make is named ``gpn<PID>...``.
PREFIX = "gpn"
#: Networks made by this process so far: each gets its own letter, since the kernel frees a
#: deleted namespace's veth pair asynchronously and a next test must not collide with it.
_made = 0

#: The ways :meth:`Host.cut` can take a host off the network (see the module docstring).
CUTS = ("down", "unplug")

#: The range the private /24 is taken from (RFC 2544: benchmarking, never routed publicly).
RANGE = ipaddress.ip_network("198.18.0.0/15")


def unavailable() -> str | None:
    """Why this machine cannot run the namespace tests, or ``None`` when it can."""
    if os.geteuid() != 0:
        return "making network namespaces needs root (run the tests as root)"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    probe = f"{PREFIX}{os.getpid()}probe"
    made = _ip("netns", "add", probe)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    try:
        inside = _ip("netns", "exec", probe, "ip", "link", "set", "lo", "up")
        if inside.returncode != 0:
            return f"`ip netns exec` failed: {inside.stderr.strip()}"
        veth = _ip("-n", probe, "link", "add", "p0", "type", "veth", "peer", "name", "p1")
        if veth.returncode != 0:
            return f"cannot make veth pairs: {veth.stderr.strip()}"
    finally:
        _ip("netns", "del", probe)
    return None


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=False, timeout=30)


def _must(*args: str) -> None:
    result = _ip(*args)
    if result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_leftovers() -> None:
    """Delete namespaces, bridges and veth ends left by runs whose process is gone."""
    pattern = re.compile(rf"^{PREFIX}(\d+)")
    names = [line.split()[0] for line in _ip("netns", "list").stdout.splitlines() if line]
    for name in names:
        m = pattern.match(name)
        if m and not _alive(int(m.group(1))):
            _kill_in(_netns_inode_of(name))
            _ip("netns", "del", name)
    for line in _ip("-o", "link", "show").stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        m = pattern.match(name)
        if m and not _alive(int(m.group(1))):
            _ip("link", "del", name)


def _free_subnet() -> ipaddress.IPv4Network:
    """The first /24 of :data:`RANGE` that no route of the root namespace overlaps."""
    taken = []
    for line in _ip("-4", "route", "show", "table", "all").stdout.splitlines():
        word = line.split()[0] if line.split() else ""
        if word in ("default", "broadcast", "local", "unreachable", "blackhole"):
            word = line.split()[1] if len(line.split()) > 1 else ""
        with contextlib.suppress(ValueError):
            taken.append(ipaddress.ip_network(word, strict=False))
    for subnet in RANGE.subnets(new_prefix=24):
        if subnet.network_address.packed[2] == 0:
            continue  # skip 198.18.0.0/24, the one most often configured by hand
        if not any(subnet.overlaps(t) for t in taken if isinstance(t, ipaddress.IPv4Network)):
            return subnet
    raise RuntimeError(f"no free /24 in {RANGE} on this machine")


def _netns_inode_of(name: str) -> int | None:
    try:
        return os.stat(f"/run/netns/{name}").st_ino
    except OSError:
        return None


def _proc_netns(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def pids_in(inode: int | None) -> list[int]:
    """The PIDs of every process in the network namespace ``inode``."""
    if inode is None:
        return []
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and _proc_netns(int(entry)) == inode:
            found.append(int(entry))
    return found


def _kill_in(inode: int | None) -> None:
    for pid in pids_in(inode):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


class Host:
    """One network namespace on the test's network (see the module docstring)."""

    def __init__(self, network: Network, name: str, address: str) -> None:
        self.network = network
        self.name = name
        self.ns = f"{network.tag}{name}"
        self.address = address
        self.inode: int | None = None
        self.outside = ""  # the veth end on the bridge, in the root namespace
        self.procs: list[subprocess.Popen[bytes]] = []

    def _create(self, index: int) -> None:
        _must("netns", "add", self.ns)
        self.inode = _netns_inode_of(self.ns)
        self.outside = f"{self.network.tag}v{index}"
        _must("link", "add", self.outside, "type", "veth", "peer", "name", "eth0", "netns", self.ns)
        _must("link", "set", self.outside, "master", self.network.bridge, "up")
        _must("-n", self.ns, "link", "set", "lo", "up")
        prefix = self.network.subnet.prefixlen
        _must("-n", self.ns, "addr", "add", f"{self.address}/{prefix}", "dev", "eth0")
        _must("-n", self.ns, "link", "set", "eth0", "up")

    def command(self, args: Sequence[str], *, user: str | None = None) -> list[str]:
        """``args`` as a command line that runs inside this host (as ``user`` when given)."""
        prefix = ["ip", "netns", "exec", self.ns]
        if user is not None:
            prefix += ["runuser", "-u", user, "--"]
        return [*prefix, *args]

    def popen(
        self,
        args: Sequence[str],
        *,
        log: Path,
        env: Mapping[str, str] | None = None,
        user: str | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start ``args`` inside this host, its output appended to ``log``."""
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                self.command(args, user=user),
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None,
                start_new_session=True,
            )
        self.procs.append(proc)
        return proc

    def run(self, args: Sequence[str], *, user: str | None = None) -> str:
        """Run ``args`` inside this host to the end; its output, or an error with it."""
        result = subprocess.run(
            self.command(args, user=user), capture_output=True, text=True, check=False, timeout=120
        )
        if result.returncode != 0:
            raise RuntimeError(f"{args[0]} on {self.name}: {result.stderr.strip()[-500:]}")
        return result.stdout

    def pids(self) -> list[int]:
        """Every process now in this host's network namespace."""
        return pids_in(self.inode)

    def cut(self, how: str = "down") -> None:
        """Take this host off the network, ``how`` one of :data:`CUTS`."""
        if how == "down":
            _must("-n", self.ns, "link", "set", "eth0", "down")
        elif how == "unplug":
            _must("link", "set", self.outside, "nomaster")
        else:
            raise ValueError(f"{how!r} is not a way to cut a host: use one of {', '.join(CUTS)}")

    def heal(self) -> None:
        """Put this host back on the network, however it was cut."""
        _must("-n", self.ns, "link", "set", "eth0", "up")
        _must("link", "set", self.outside, "master", self.network.bridge)

    def kill_all(self) -> None:
        """SIGKILL every process in this host."""
        _kill_in(self.inode)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)

    def _destroy(self) -> None:
        # Sockets still closing pin a namespace (and its veth pair) after its processes are
        # gone: destroy them first (best effort: `ss -K` needs the kernel's sock_destroy).
        subprocess.run(
            self.command(["ss", "-K", "-a"]), capture_output=True, check=False, timeout=30
        )
        _ip("netns", "del", self.ns)
        _ip("link", "del", self.outside)


class Network:
    """The test's private /24 with its bridge, and the hosts on it (see the module docstring)."""

    def __init__(self) -> None:
        global _made  # noqa: PLW0603 - one counter per test process
        sweep_leftovers()
        self.tag = f"{PREFIX}{os.getpid()}{'abcdefghijklmnopqrstuvwxyz'[_made % 26]}"
        _made += 1
        self.subnet = _free_subnet()
        self.bridge = f"{self.tag}br"
        if len(self.bridge) > 15 or len(f"{self.tag}v99") > 15:
            raise RuntimeError(f"interface names from {self.tag!r} are too long for Linux")
        self.hosts: dict[str, Host] = {}
        self._addresses = self.subnet.hosts()
        gateway = next(self._addresses)
        _must("link", "add", self.bridge, "type", "bridge")
        try:
            _must("addr", "add", f"{gateway}/{self.subnet.prefixlen}", "dev", self.bridge)
            _must("link", "set", self.bridge, "up")
        except RuntimeError:
            _ip("link", "del", self.bridge)
            raise

    def add(self, name: str) -> Host:
        """A new host called ``name`` with the next free address."""
        host = Host(self, name, str(next(self._addresses)))
        self.hosts[name] = host
        host._create(len(self.hosts))
        return host

    def close(self) -> None:
        """Kill every process in every host, delete the hosts and the bridge."""
        for host in self.hosts.values():  # all first, while they can still close connections
            host.kill_all()
        for host in self.hosts.values():
            host._destroy()
        self.hosts.clear()
        _ip("link", "del", self.bridge)
