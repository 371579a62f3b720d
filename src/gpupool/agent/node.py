"""Facts about this node for registration: name, address, CPUs, memory, devices.

Devices are registered as the scheduler places work on them: a physical GPU, or, on a GPU with
MIG enabled, each of its MIG instances instead (the parent is then not schedulable as a whole,
and a MIG-enabled GPU without instances registers nothing). A MIG instance's model is its
profile (``MIG 1g.18gb``), so a request for an ``H200`` never lands on a slice of one.
NVLink groups are the connected components of the NVLink peer graph, numbered by their lowest
device index; a GPU without peers has no group (``None``).

The **agent id** (:func:`agent_identity`) tells the server which agent speaks for a node: a
random id made once per state folder (``<state>/agent-id``), so a restarted agent is the same
agent and a second agent given the same node name (two machines with one host name, or a copy
started by mistake) is not; the server refuses the second while the first is alive.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import socket
from pathlib import Path

from gpupool.gpu.base import DeviceInfo
from gpupool.schemas.agent import DeviceInfo as WireDevice


def default_node_name() -> str:
    """The host name as a lowercase DNS label (``GPU-Box_01.lab`` -> ``gpu-box-01``)."""
    host = socket.gethostname().split(".")[0].lower()
    name = re.sub(r"[^a-z0-9-]+", "-", host).strip("-")[:63]
    return name or "node"


def agent_identity(state_dir: Path) -> str:
    """This agent's id: read from ``<state_dir>/agent-id``, made there on first use."""
    path = state_dir / "agent-id"
    try:
        found = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        found = ""
    if re.fullmatch(r"[0-9a-f]{16,64}", found):
        with contextlib.suppress(OSError):
            path.chmod(0o600)  # one made by an older agent
        return found
    state_dir.mkdir(parents=True, exist_ok=True)
    made = secrets.token_hex(16)
    tmp = path.with_name("agent-id.tmp")
    tmp.write_text(made + "\n", encoding="ascii")
    tmp.chmod(0o600)  # it vouches for the node (results): no job may read it
    os.replace(tmp, path)
    return made


def default_address() -> str:
    """An address other nodes may reach this one at (for ``MASTER_ADDR``)."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def host_cpu_milli() -> int:
    return (os.cpu_count() or 1) * 1000


def host_memory_mib() -> int:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        pass
    return 0


def nvlink_groups(devices: tuple[DeviceInfo, ...]) -> dict[str, int | None]:
    """UUID -> NVLink group id (lowest device index of its component), ``None`` when alone."""
    parent = {d.uuid: d.uuid for d in devices}

    def find(u: str) -> str:
        while parent[u] != u:
            parent[u] = parent[parent[u]]
            u = parent[u]
        return u

    for d in devices:
        for peer in d.nvlink_peers:
            if peer in parent:
                parent[find(d.uuid)] = find(peer)
    index = {d.uuid: d.index for d in devices}
    members: dict[str, list[str]] = {}
    for d in devices:
        members.setdefault(find(d.uuid), []).append(d.uuid)
    groups: dict[str, int | None] = {}
    for group in members.values():
        gid = min(index[u] for u in group) if len(group) > 1 else None
        for u in group:
            groups[u] = gid
    return groups


def mig_model(profile: str | None) -> str:
    """The model a MIG instance registers as: ``MIG 1g.18gb`` (``MIG`` when unknown)."""
    return f"MIG {profile}" if profile else "MIG"


def wire_devices(devices: tuple[DeviceInfo, ...]) -> list[WireDevice]:
    """The devices to register: whole GPUs, or the MIG instances of MIG-enabled ones."""
    groups = nvlink_groups(devices)
    wire: list[WireDevice] = []
    for d in devices:
        if d.mig_enabled:  # its instances, each its own model; none: nothing placeable
            for m in d.mig_instances:
                wire.append(
                    WireDevice(
                        uuid=m.uuid,
                        index=len(wire),
                        model=mig_model(m.profile),
                        memory_mib=m.memory_mib,
                        compute_capability=d.compute_capability,
                        mig_parent=d.uuid,
                        mig_profile=m.profile,
                    )
                )
            continue
        wire.append(
            WireDevice(
                uuid=d.uuid,
                index=len(wire),
                model=d.name,
                memory_mib=d.memory_mib,
                compute_capability=d.compute_capability,
                nvlink_group=groups.get(d.uuid),
            )
        )
    return wire
